"""An optimizer over FSDP2's sharded parameters that steps each process's rows as plain
tensors: what bitsandbytes' kernels need, and what lets an optimizer that reads whole
tensors (Adafactor, GaLore) sum its partial results over the processes itself.

``LocalRowsOptimizer(groups, make)`` builds the inner optimizer with ``make`` over views
of the local rows (``param.to_local()``: the same storage, so an update of the view is an
update of the shard) and, where the inner optimizer has ``set_row_shards``, tells it
which rows of which whole tensor each view holds (``memfit.optim.row_shards``).
``step()`` hands the inner optimizer the local rows of the reduce-scattered gradients.
Layer-wise updates (an inner ``LayerwiseOptimizer``) are driven by FSDP2 itself: it runs
each sharded parameter's post-accumulate-grad hooks once its reduce-scatter has finished,
and the hook passes the local rows on.

Its ``param_groups`` list the sharded parameters (DTensors), so
``torch.distributed.checkpoint.state_dict`` maps the state to parameter names, and its
``state_dict()`` wraps every state tensor divided like the rows into a DTensor placed as
the inner optimizer says (``state_placement``; elementwise state: dim 0): DCP then writes
each process's part and reshards on load, to another number of processes or to one. State
the inner optimizer keeps whole on every process (GaLore's P, Adafactor's column
statistics of a matrix) is saved as a plain tensor, once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Shard
from torch.optim import Optimizer

from memfit.optim.row_shards import RowShard, elementwise_placement

Factory = Callable[[list[dict]], Optimizer]


def _local_view(param: DTensor) -> torch.Tensor:
    """A plain tensor sharing the shard's storage (rows x param.shape[1:])."""
    with torch.no_grad():
        view = param.to_local().detach()
    if not view.is_contiguous():  # bitsandbytes would step a contiguous copy instead
        raise RuntimeError(f"the local shard of a {tuple(param.shape)} parameter is not "
                           "contiguous")
    return view


def _hyperparameters(group: dict) -> dict:
    return {key: value for key, value in group.items() if key != "params"}


class LocalRowsOptimizer(Optimizer):
    """Steps the local rows of FSDP2 parameters with an inner optimizer (module docstring)."""

    def __init__(self, groups: list[dict], make: Factory) -> None:
        self._pairs: list[tuple[DTensor, torch.Tensor]] = []  # (sharded param, its rows)
        inner_groups = []
        for group in groups:
            views = [_local_view(param) for param in group["params"]]
            self._pairs += zip(group["params"], views, strict=True)
            inner_groups.append({**group, "params": views})
        self.inner = make(inner_groups)
        set_row_shards = getattr(self.inner, "set_row_shards", None)
        if set_row_shards is not None:
            set_row_shards({view: RowShard.of_dtensor(param) for param, view in self._pairs})
        super().__init__([{**_hyperparameters(inner), "params": group["params"]}
                          for inner, group in zip(self.inner.param_groups, groups,
                                                  strict=True)],
                         self.inner.defaults)
        self.state = self.inner.state  # keyed by the views: what the memory meter counts
        self.steps_in_backward = getattr(self.inner, "steps_in_backward", False)
        if self.steps_in_backward:
            for param, view in self._pairs:
                if param.requires_grad:
                    param.register_post_accumulate_grad_hook(self._hand_over(view))

    def _hand_over(self, view: torch.Tensor) -> Callable[[DTensor], None]:
        def hook(param: DTensor) -> None:
            view.grad, param.grad = param.grad.to_local(), None
            self.inner.take_gradient(view)

        return hook

    def _sync_hyperparameters(self) -> None:
        """An LR scheduler (or DCP's state initialization) sets them on these groups."""
        for outer, inner in zip(self.param_groups, self.inner.param_groups, strict=True):
            inner.update(_hyperparameters(outer))

    @property
    def grad_norm(self) -> float | None:
        return self.inner.grad_norm

    def begin_micro_batch(self, index: int) -> None:
        self._sync_hyperparameters()  # layer-wise steps run in the backward that follows
        self.inner.begin_micro_batch(index)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """The inner step on the local rows of the gradients still in ``.grad`` (layer-wise
        updates took theirs in backward)."""
        self._sync_hyperparameters()
        for param, view in self._pairs:
            view.grad = None if param.grad is None else param.grad.to_local()
        try:
            return self.inner.step(closure)
        finally:
            for _, view in self._pairs:
                view.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param, _ in self._pairs:
            param.grad = None

    def _placement(self, view: torch.Tensor, key: str, value: torch.Tensor) -> int | None:
        placement = getattr(self.inner, "state_placement", None)
        if placement is None:
            return elementwise_placement(view, value)
        return placement(view, key)

    def state_dict(self) -> dict[str, Any]:
        saved = self.inner.state_dict()
        # New dicts: torch's state_dict() hands out the live per-parameter state dicts.
        saved["state"] = {index: {key: self._saved(index, key, value)
                                  for key, value in entries.items()}
                          for index, entries in saved["state"].items()}
        return saved

    def _saved(self, index: int, key: str, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        param, view = self._pairs[index]
        dim = self._placement(view, key, value)
        return value if dim is None else _divided(value, param, dim)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = {index: {key: value.to_local() if isinstance(value, DTensor) else value
                         for key, value in entries.items()}
                 for index, entries in state_dict["state"].items()}
        self.inner.load_state_dict({**state_dict, "state": state})
        self.state = self.inner.state
        for outer, inner in zip(self.param_groups, self.inner.param_groups, strict=True):
            outer.update(_hyperparameters(inner))


def _divided(local: torch.Tensor, param: DTensor, dim: int) -> DTensor:
    """``local`` as this process's part of a whole tensor divided along ``dim`` as the
    parameter's rows are (the whole has param.shape[0] there)."""
    shape = list(local.shape)
    shape[dim] = param.shape[0]
    whole = torch.Size(shape)
    stride = torch.empty(whole, device="meta").stride()
    return DTensor.from_local(local, param.device_mesh, [Shard(dim)], run_check=False,
                              shape=whole, stride=stride)
