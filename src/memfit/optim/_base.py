"""Behaviour shared by memfit's optimizers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.optim import Optimizer


class StatePreservingOptimizer(Optimizer):
    """An Optimizer whose state tensors keep their own dtype across load_state_dict.

    torch's load_state_dict casts every floating state tensor to its parameter's dtype, which
    would silently turn the fp32 moments (and projection bases) of a bf16 parameter into bf16
    and break "save -> load -> continue equals uninterrupted training".
    """

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Update every parameter that has a gradient (``_update_parameter``)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group, position, param in self.groups_and_positions():
            if self._has_gradient(param):
                self._update_parameter(group, position, param)
        return loss

    def _has_gradient(self, param: torch.Tensor) -> bool:
        return param.grad is not None

    def _update_parameter(self, group: dict[str, Any], position: int,
                          param: torch.Tensor) -> None:
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        for param, saved_id in zip(self.parameters(), saved_ids, strict=True):
            for key, value in state_dict["state"].get(saved_id, {}).items():
                if isinstance(value, torch.Tensor):
                    self.state[param][key] = value.to(device=param.device, copy=True)

    def parameters(self) -> Iterator[torch.Tensor]:
        """Every parameter, in group order; its index is its position for random streams."""
        for group in self.param_groups:
            yield from group["params"]

    def groups_and_positions(self) -> Iterator[tuple[dict[str, Any], int, torch.Tensor]]:
        """(group, position, param) for every parameter, in order."""
        position = 0
        for group in self.param_groups:
            for param in group["params"]:
                yield group, position, param
                position += 1

    def locate(self, param: torch.Tensor) -> tuple[dict[str, Any], int]:
        """(group, position) of `param` in this optimizer."""
        for group, position, candidate in self.groups_and_positions():
            if candidate is param:
                return group, position
        raise KeyError("parameter is not managed by this optimizer")
