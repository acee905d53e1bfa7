"""Layer-wise updates: each parameter is stepped inside backward, as soon as its gradient
is complete, so at most one full-size gradient is alive at a time.

    optimizer = LayerwiseOptimizer(model.parameters(),
                                   make_optimizer=lambda groups: GaLore(groups, rank=64),
                                   gradient_accumulation_steps=4, max_grad_norm=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, ...)
    for step_batches in loader:                      # 4 micro-batches per optimizer step
        for index, micro_batch in enumerate(step_batches):
            optimizer.begin_micro_batch(index)       # required when accumulating
            loss_fn(model, micro_batch).backward()   # hooks accumulate, or step on the last
        optimizer.step()                             # publishes grad_norm; no update
        scheduler.step()
        optimizer.zero_grad()

`make_optimizer` is called once per parameter with one group (the user's group options
and that single parameter). Hyperparameters live in this wrapper's param_groups; before
each inner step they are copied into the inner optimizer, so LR schedulers work. An inner
optimizer with a `seed` option gets seed + the parameter's index, which reproduces the
random streams of one optimizer built over all parameters.

Gradient accumulation: on micro-batches 0..N-2 each hook moves p.grad into a buffer and
frees p.grad; on micro-batch N-1 the hook adds the buffer and steps. Buffers are full-size
(the gradient's dtype), except for GaLore-projected parameters (svd, randomized_svd,
online), whose buffer is the fp32 projected gradient R = P^T G (r x l). Because the SVD
needs a full gradient, `projector_refresh` decides what happens on steps that compute a
new P:
  "micro_batch"    (default) P is computed from the first micro-batch's gradient, then
                   every micro-batch is projected with it; buffers stay r x l on every step.
                   Exactly projected Adam on the accumulated gradient; P is estimated from
                   1/N of the batch.
  "full_gradient"  on those steps the parameter accumulates its full gradient instead, so
                   P comes from the whole batch and training equals the ordinary loop; the
                   buffers are full-size on refresh steps (all parameters on the first step).

Linear layers routed with memfit.optim.backward_projection.project_in_backward(model, this
optimizer, ...) hand over R = P^T g computed in their backward (no full gradient formed)
whenever the inner GaLore already has this step's P; they go through the same buffer and
step as R projected from a full gradient.

Clipping (max_grad_norm): per tensor. Each parameter's accumulated gradient (for GaLore
parameters whose gradient is accumulated or arrives projected, R) is scaled by
min(1, max_grad_norm / ||g||) just before its inner step — exactly clip_grad_norm_ applied
to that tensor alone. A global norm is not known until backward ends, after most
parameters were stepped. `grad_norm` reports the pre-clip global norm sqrt(sum ||g||^2)
over the gradients the inner optimizers consumed (||R|| where R was consumed: a lower
bound on ||G||).

Several processes (``reduce_across_processes(all_reduce)``, set by memfit's data
parallel): a parameter's gradient (full, or R) is summed over the processes before its
update. On the last micro-batch its hook starts an asynchronous all-reduce and finishes
the PREVIOUS parameter (wait, clip, step), so one reduction is in flight while the next
gradient is computed and at most one more full-size gradient is alive than with one
process; ``step()`` finishes the last. A step that refreshes GaLore's P from a micro-batch
gradient ("micro_batch") takes it from that gradient's sum over the processes (a copy,
reduced synchronously), so every process derives the same P; each process then projects
its own gradient, and the R buffers are summed at the end as above.

fp16 with torch.amp.GradScaler is not supported: gradients are consumed before the scaler
could unscale them or check them for inf. Reject that combination at config time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Literal, Protocol

import torch
from torch.optim import Optimizer

from memfit._utils.errors import ConfigError
from memfit.optim.galore import GaLore
from memfit.optim.galore_layout import is_tall
from memfit.optim.row_shards import RowShard, elementwise_placement

REFRESH_CHOICES: tuple[str, ...] = ("micro_batch", "full_gradient")


class Reduction(Protocol):
    """A started in-place all-reduce (``torch.distributed.Work``)."""

    def wait(self) -> Any: ...


# (index, parameter, gradient being reduced, projected, its reduction)
_Pending = tuple[int, torch.Tensor, torch.Tensor, bool, Reduction]


class LayerwiseOptimizer(Optimizer):
    """Optimizer-in-backward wrapper over one inner optimizer per parameter."""

    # Read by a training step (memfit.training.step): the updates run in backward, after
    # begin_micro_batch(index); step() only publishes grad_norm.
    steps_in_backward = True

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        make_optimizer: Callable[[list[dict[str, Any]]], Optimizer],
        gradient_accumulation_steps: int = 1,
        max_grad_norm: float | None = None,
        projector_refresh: Literal["micro_batch", "full_gradient"] = "micro_batch",
    ) -> None:
        if not isinstance(gradient_accumulation_steps, int) or gradient_accumulation_steps < 1:
            raise ConfigError(
                f"gradient_accumulation_steps={gradient_accumulation_steps!r} must be an "
                "integer >= 1"
            )
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ConfigError(f"max_grad_norm={max_grad_norm!r} must be > 0 or None")
        if projector_refresh not in REFRESH_CHOICES:
            raise ConfigError(
                f"projector_refresh={projector_refresh!r} is not one of: "
                + ", ".join(REFRESH_CHOICES)
            )
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.max_grad_norm = max_grad_norm
        self.projector_refresh = projector_refresh
        self.grad_norm: float | None = None
        self._micro_batch: int | None = None
        self._buffers: dict[int, torch.Tensor] = {}
        # 0-d fp32 tensors, one per stepped parameter; summed (one host sync) in step().
        self._squared_norms: list[torch.Tensor] = []
        self._all_reduce: Callable[[torch.Tensor], Reduction] | None = None
        self._pending: _Pending | None = None

        user_groups = list(params)
        if user_groups and not isinstance(user_groups[0], dict):
            user_groups = [{"params": user_groups}]
        self._optimizers: list[Optimizer] = []
        outer_groups = []
        for user_group in user_groups:
            options = {k: v for k, v in user_group.items() if k != "params"}
            group_params = list(user_group["params"])
            for param in group_params:
                inner = make_optimizer([{**options, "params": [param]}])
                if "seed" in inner.param_groups[0]:
                    inner.param_groups[0]["seed"] += len(self._optimizers)
                self._optimizers.append(inner)
            if group_params:
                first = self._optimizers[len(self._optimizers) - len(group_params)]
                hyper = {k: v for k, v in first.param_groups[0].items() if k != "params"}
                if "seed" in hyper:
                    hyper["seed"] -= len(self._optimizers) - len(group_params)
                outer_groups.append({**hyper, "params": group_params})
        super().__init__(outer_groups, defaults={})
        self._params = [p for group in self.param_groups for p in group["params"]]
        self._index = {id(p): index for index, p in enumerate(self._params)}
        self._group_of = [group for group in self.param_groups for _ in group["params"]]
        self._shards: dict[int, RowShard] = {}
        # Each parameter's inner state, by parameter (what memory meters and
        # torch.distributed.checkpoint read as this optimizer's state).
        self.state = {}
        for index, param in enumerate(self._params):
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._make_hook(index))

    @property
    def inner_optimizers(self) -> list[Optimizer]:
        """The per-parameter optimizers, in parameter order."""
        return list(self._optimizers)

    def reduce_across_processes(self, all_reduce: Callable[[torch.Tensor], Reduction]) -> None:
        """Sum every gradient over the processes before its update: ``all_reduce(t)``
        starts an in-place sum of ``t`` and returns a handle to wait on."""
        self._all_reduce = all_reduce

    def set_row_shards(self, shards: dict[torch.Tensor, RowShard]) -> None:
        """The parameters hold rows of whole tensors (FSDP2: memfit.distributed.local_rows):
        each inner optimizer learns its parameter's rows, and per-tensor clipping takes the
        norm of the whole gradient."""
        for param, shard in shards.items():
            index = self._index[id(param)]
            self._shards[index] = shard
            set_inner = getattr(self._optimizers[index], "set_row_shards", None)
            if set_inner is not None:
                set_inner({param: shard})

    def state_placement(self, param: torch.Tensor, key: str) -> int | None:
        """Along which dim ``state[param][key]`` is divided like the rows (None: whole)."""
        inner = self._optimizers[self._index[id(param)]]
        placement = getattr(inner, "state_placement", None)
        if placement is not None:
            return placement(param, key)
        return elementwise_placement(param, inner.state[param][key])

    def take_gradient(self, param: torch.Tensor) -> None:
        """What the post-accumulate-grad hook does, for a caller holding the gradient of
        ``param`` in ``param.grad`` (FSDP2's reduce-scattered rows)."""
        self._on_gradient(self._index[id(param)], param)

    def begin_micro_batch(self, index: int) -> None:
        """Declare that the next backward is micro-batch `index` of
        0..gradient_accumulation_steps-1; the last one steps the parameters."""
        if not 0 <= index < self.gradient_accumulation_steps:
            raise ValueError(
                f"micro-batch index {index} is outside 0..{self.gradient_accumulation_steps - 1}"
            )
        self._micro_batch = index

    def accumulation_buffer_bytes(self) -> int:
        """Peak bytes the accumulation buffers reach (0 without accumulation)."""
        if self.gradient_accumulation_steps == 1:
            return 0
        return sum(self.buffer_bytes(param.numel() * param.element_size(),
                                     self._projected_shape(index, param), self.projector_refresh)
                   for index, param in enumerate(self._params))

    @staticmethod
    def buffer_bytes(grad_bytes: int, projected_shape: torch.Size | tuple[int, ...] | None,
                     projector_refresh: str) -> int:
        """Peak bytes of one parameter's accumulation buffer: the fp32 R (r x l) when its
        gradients accumulate projected on every step, else a full-size gradient (with
        "full_gradient", every parameter accumulates in full on the first step). The
        planner calls this too."""
        if projected_shape is not None and projector_refresh == "micro_batch":
            return 4 * math.prod(projected_shape)
        return grad_bytes

    def _projected_shape(self, index: int, param: torch.Tensor) -> torch.Size | None:
        inner = self._optimizers[index]
        return inner.accumulation_shape(param) if isinstance(inner, GaLore) else None

    def _uses_projected_buffer(self, index: int, param: torch.Tensor) -> bool:
        if self.gradient_accumulation_steps == 1 or self._projected_shape(index, param) is None:
            return False
        if self.projector_refresh == "micro_batch":
            return True
        return not self._optimizers[index].refresh_pending(param)

    def _make_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            self._on_gradient(index, param)

        return hook

    # ----- gradients projected in backward (memfit/optim/backward_projection.py) ------

    def backward_projection_basis(self, param: torch.Tensor) -> torch.Tensor | None:
        """The inner GaLore's P when `param`'s gradient may arrive projected, else None."""
        inner = self._optimizers[self._index[id(param)]]
        return inner.backward_projection_basis(param) if isinstance(inner, GaLore) else None

    @torch.no_grad()
    def add_projected_gradient(self, param: torch.Tensor, projected: torch.Tensor) -> None:
        """One micro-batch's R = P^T g of `param`: accumulated, or stepped on the last."""
        self._check_micro_batch()
        self._consume(self._index[id(param)], param, projected, projected=True)

    def _check_micro_batch(self) -> None:
        if self.gradient_accumulation_steps > 1 and self._micro_batch is None:
            raise RuntimeError(
                "LayerwiseOptimizer: call begin_micro_batch(index) before each backward when "
                "gradient_accumulation_steps > 1"
            )

    @torch.no_grad()
    def _on_gradient(self, index: int, param: torch.Tensor) -> None:
        if param.grad is None:  # the hook runs even when backward projected the gradient
            return
        self._check_micro_batch()
        grad, param.grad = param.grad, None
        projected = self._uses_projected_buffer(index, param)
        if projected:
            inner = self._optimizers[index]
            if self._all_reduce is not None and inner.refresh_pending(param):
                # This projection computes P: from the sum over processes, so that all
                # of them derive the same P; each then projects its own gradient.
                summed = grad.clone()
                self._all_reduce(summed).wait()
                inner.project_gradient(param, summed)
                del summed
            grad = inner.project_gradient(param, grad)
        self._consume(index, param, grad, projected)

    def _consume(self, index: int, param: torch.Tensor, grad: torch.Tensor,
                 projected: bool) -> None:
        """Add `grad` (full, or R when `projected`) to the buffer, or clip and step."""
        buffer = self._buffers.pop(index, None)
        if buffer is not None:
            grad = buffer.add_(grad)
        if (
            self._micro_batch is not None
            and self._micro_batch < self.gradient_accumulation_steps - 1
        ):
            self._buffers[index] = grad
            return
        if self._all_reduce is None:
            self._clip_and_step(index, param, grad, projected)
            return
        started = (index, param, grad, projected, self._all_reduce(grad))
        self._finish_pending()
        self._pending = started

    def _finish_pending(self) -> None:
        """Wait for the reduction in flight, then update its parameter."""
        if self._pending is not None:
            index, param, grad, projected, reduction = self._pending
            self._pending = None
            reduction.wait()
            self._clip_and_step(index, param, grad, projected)

    def _clip_and_step(self, index: int, param: torch.Tensor, grad: torch.Tensor,
                       projected: bool) -> None:
        square = torch.linalg.vector_norm(grad, dtype=torch.float32).square()
        shard = self._shards.get(index)
        if shard is not None and self._holds_rows(shard, projected):
            shard.sum_(square)  # the whole tensor's norm, as on one process
        self._squared_norms.append(square)
        norm = square.sqrt()
        if self.max_grad_norm is not None:
            # Same coefficient as clip_grad_norm_, as a tensor so the hook never syncs.
            grad.mul_(torch.clamp(self.max_grad_norm / (norm + 1e-6), max=1.0))
        self._step_inner(index, param, grad, projected)

    @staticmethod
    def _holds_rows(shard: RowShard, projected: bool) -> bool:
        """Whether a consumed gradient of a sharded parameter is only this process's part:
        its rows, or GaLore's R of a tall weight (r x local rows); the R of a wide weight is
        summed over the processes when projected, so it is whole (memfit.optim.galore)."""
        return not projected or is_tall(shard.full_shape)

    def _step_inner(
        self, index: int, param: torch.Tensor, grad: torch.Tensor, projected: bool
    ) -> None:
        inner = self._optimizers[index]
        inner_group = inner.param_groups[0]
        for key, value in self._group_of[index].items():
            if key != "params":
                inner_group[key] = value + index if key == "seed" else value
        if projected:
            inner.step_projected(param, grad)
        else:
            param.grad = grad
            inner.step()
            param.grad = None
        self.state[param] = inner.state[param]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """End of an optimizer step: the updates already ran inside backward.

        Runs `closure` (whose backward triggers the hooks) if given, publishes grad_norm
        and checks no micro-batch gradient was left in a buffer (a loop whose last
        begin_micro_batch index was not gradient_accumulation_steps - 1).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._finish_pending()
        for index, param in enumerate(self._params):
            if param.grad is not None:  # set outside backward, so no hook took it
                grad, param.grad = param.grad, None
                self._clip_and_step(index, param, grad, projected=False)
        if self._buffers:
            raise RuntimeError(
                f"LayerwiseOptimizer.step() with {len(self._buffers)} gradients still "
                f"accumulating: the last backward must follow "
                f"begin_micro_batch({self.gradient_accumulation_steps - 1})"
            )
        self.grad_norm = math.sqrt(sum(float(square) for square in self._squared_norms))
        self._squared_norms = []
        self._micro_batch = None
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear p.grad (normally already None); accumulation buffers are kept."""
        for param in self._params:
            param.grad = None

    def state_dict(self) -> dict[str, Any]:
        """torch's layout, as if one optimizer held every parameter: ``state`` by parameter
        index (each inner optimizer's state of its parameter) and the ``param_groups``.
        torch.distributed.checkpoint maps it to parameter names, and a checkpoint of the
        same optimizer without layer-wise updates has the same layout.

        Save only at step boundaries: accumulation buffers are not part of the state.
        """
        if self._buffers:
            raise RuntimeError("LayerwiseOptimizer.state_dict() during gradient accumulation")
        state = {}
        for index, inner in enumerate(self._optimizers):
            saved = inner.state_dict()["state"]
            if saved:
                state[index] = saved[0]  # its only parameter
        groups, start = [], 0
        for group in self.param_groups:
            count = len(group["params"])
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": list(range(start, start + count))})
            start += count
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "state" not in state_dict:
            raise ValueError("this layer-wise optimizer state was saved by an earlier memfit "
                             "(one state_dict per parameter), which this one cannot read")
        groups, state = state_dict["param_groups"], state_dict["state"]
        counts = [len(group["params"]) for group in groups]
        if counts != [len(group["params"]) for group in self.param_groups]:
            raise ValueError(f"state_dict has groups of {counts} parameters, this optimizer "
                             f"{[len(group['params']) for group in self.param_groups]}")
        for group, saved in zip(self.param_groups, groups, strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
        indices = [index for group in groups for index in group["params"]]
        self.state = {}
        for index, (inner, saved_index) in enumerate(zip(self._optimizers, indices,
                                                         strict=True)):
            hyper = {k: v for k, v in inner.param_groups[0].items() if k != "params"}
            entries = state.get(saved_index)
            inner.load_state_dict({"state": {0: entries} if entries is not None else {},
                                   "param_groups": [{**hyper, "params": [0]}]})
            param = self._params[index]
            if param in inner.state:
                self.state[param] = inner.state[param]
