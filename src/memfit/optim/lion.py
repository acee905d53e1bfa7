"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2):
the sign of an interpolation of momentum and gradient, so every coordinate moves by
exactly lr, and one moment instead of Adam's two.

Per parameter, with gradient g and momentum m (zeros at first):
  theta <- theta * (1 - lr * weight_decay)             decoupled weight decay
  theta <- theta - lr * sign(beta1 * m + (1 - beta1) * g)
  m     <- beta2 * m + (1 - beta2) * g
The paper's defaults are beta1 = 0.9, beta2 = 0.99, with a learning rate 3-10x smaller
than AdamW's and a weight decay 3-10x larger. Elementwise, so it steps row shards as they
are (FSDP2). State: m in the parameter's dtype. Scratch: the direction, one
parameter-sized tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from memfit.optim._base import StatePreservingOptimizer


class Lion(StatePreservingOptimizer):
    def __init__(self, params: Iterable[Any], lr: float = 1e-4,
                 betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0) -> None:
        if not lr > 0:
            raise ValueError(f"Lion: lr must be above 0, got {lr}")
        if not all(0 <= beta < 1 for beta in betas):
            raise ValueError(f"Lion: betas must each be in [0, 1), got {betas}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas),
                                  "weight_decay": weight_decay})

    def _update_parameter(self, group: dict[str, Any], position: int,
                          param: torch.Tensor) -> None:
        grad, state = param.grad, self.state[param]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(param)
        momentum = state["exp_avg"]
        beta1, beta2 = group["betas"]
        if group["weight_decay"]:
            param.mul_(1 - group["lr"] * group["weight_decay"])
        direction = momentum.lerp(grad, 1 - beta1).sign_()
        param.add_(direction, alpha=-group["lr"])
        momentum.lerp_(grad, 1 - beta2)
