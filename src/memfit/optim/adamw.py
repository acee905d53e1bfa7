"""AdamW whose bf16 parameters are written back with stochastic rounding ("bf16-pure").

torch.optim.AdamW on bf16 parameters rounds every update to nearest, so updates below half
a bf16 ulp of the weight are lost. Here the update is computed in fp32 from fp32 moments
(the same inner rule GaLore uses) and rounded stochastically into the bf16 weight. On fp32
parameters it matches torch.optim.AdamW.

Large parameters are updated in row chunks (memfit.optim.inner.inner_directions_by_rows):
only chunk-sized fp32 temporaries exist at a time, not full-size copies of each gradient.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from memfit.config.choices import GaloreInner
from memfit.optim._base import StatePreservingOptimizer
from memfit.optim.inner import inner_directions_by_rows
from memfit.optim.stochastic_rounding import apply_updates_by_rows_, mix_seed


class AdamW(StatePreservingOptimizer):
    """AdamW (Loshchilov & Hutter) with decoupled weight decay and fp32 moments.

    `seed` fixes the stochastic-rounding stream, derived per (parameter, step) so resuming
    from a state_dict reproduces uninterrupted training exactly.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        seed: int = 0,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "seed": seed,
        }
        super().__init__(params, defaults)

    def _update_parameter(self, group: dict[str, Any], position: int,
                          param: torch.Tensor) -> None:
        state = self.state[param]
        step = state.get("inner_step", 0)
        apply_updates_by_rows_(
            param,
            inner_directions_by_rows(state, param.grad, GaloreInner.ADAMW, group["betas"],
                                     group["eps"]),
            group["lr"],
            1 - group["lr"] * group["weight_decay"],
            mix_seed(group["seed"] + position, step),
        )
