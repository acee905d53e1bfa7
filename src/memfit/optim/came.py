"""CAME (Luo et al. 2023, "CAME: Confidence-guided Adaptive Memory Efficient Optimization",
ACL 2023, Algorithm 1): Adafactor's factored second moment, a first moment, and a second
factored statistic of how far each update strays from that moment (its "instability"),
which scales the step down where the update is not to be trusted.

Per matrix parameter W (n x m, or any tensor over its last two dims) with gradient G:
  r <- beta2 r + (1 - beta2) mean_cols(G^2 + eps1)         one value per row (n)
  c <- beta2 c + (1 - beta2) mean_rows(G^2 + eps1)         one per column (m)
  U = G / sqrt(r c^T / mean(r))                            the factored second moment
  U <- U / max(1, RMS(U) / d)                              clipped to an RMS of d
  M <- beta1 M + (1 - beta1) U                             first moment (n x m)
  I = (U - M)^2 + eps2                                     instability
  R <- beta3 R + (1 - beta3) mean_cols(I)                  (n)
  C <- beta3 C + (1 - beta3) mean_rows(I)                  (m)
  W <- W (1 - lr weight_decay) - lr M / sqrt(R C^T / mean(R))
The paper writes the factored estimate with sums, r c^T / (1^T r); with means it is the
same value. A vector (a bias, a norm's scale) keeps a plain second moment and steps with
M alone, as the authors' code does. The paper's defaults: lr 2e-4, betas (0.9, 0.999),
beta3 0.9999, eps (1e-30, 1e-16), d 1.

State, in the parameter's dtype: M, (r, c) and (R, C) per matrix, n x m + 2 (n + m)
values; M and the second moment per vector, 2 per value. Scratch while one parameter
steps: one parameter-sized tensor at a time (G^2, then U, which becomes I in place, then
the step), and for a matrix row and column temporaries.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from memfit.optim._base import StatePreservingOptimizer

# State keys: the first moment, the second moment's row and column means (or the whole
# second moment of a vector), and the instability's row and column means.
MOMENT, ROWS, COLUMNS, SQUARES = "exp_avg", "exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq"
INSTABILITY_ROWS, INSTABILITY_COLUMNS = "exp_avg_res_row", "exp_avg_res_col"


class CAME(StatePreservingOptimizer):
    def __init__(self, params: Iterable[Any], lr: float = 2e-4,
                 betas: tuple[float, float] = (0.9, 0.999), beta3: float = 0.9999,
                 eps: tuple[float, float] = (1e-30, 1e-16), clip_threshold: float = 1.0,
                 weight_decay: float = 0.0) -> None:
        if not lr > 0:
            raise ValueError(f"CAME: lr must be above 0, got {lr}")
        if not all(0 <= beta < 1 for beta in (*betas, beta3)):
            raise ValueError(f"CAME: betas and beta3 must each be in [0, 1), got "
                             f"{(*betas, beta3)}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "beta3": beta3,
                                  "eps": tuple(eps), "clip_threshold": clip_threshold,
                                  "weight_decay": weight_decay})

    def _update_parameter(self, group: dict[str, Any], position: int,
                          param: torch.Tensor) -> None:
        grad, state = param.grad, self.state[param]
        beta1, beta2 = group["betas"]
        eps1, eps2 = group["eps"]
        factored = param.dim() >= 2
        if MOMENT not in state:
            state[MOMENT] = torch.zeros_like(param)
            if factored:
                for key in (ROWS, INSTABILITY_ROWS):  # (..., n)
                    state[key] = param.new_zeros(param.shape[:-1])
                for key in (COLUMNS, INSTABILITY_COLUMNS):  # (..., m)
                    state[key] = param.new_zeros((*param.shape[:-2], param.shape[-1]))
            else:
                state[SQUARES] = torch.zeros_like(param)
        moment = state[MOMENT]
        squares = grad.square().add_(eps1)
        if factored:
            _lerp_means(state[ROWS], state[COLUMNS], squares, 1 - beta2)
            del squares
            update = _factored_rsqrt(state[ROWS], state[COLUMNS]).mul_(grad)
        else:
            state[SQUARES].lerp_(squares, 1 - beta2)
            del squares
            update = state[SQUARES].rsqrt().mul_(grad)
        rms = torch.linalg.vector_norm(update) / update.numel() ** 0.5
        update.div_((rms / group["clip_threshold"]).clamp_(min=1.0))
        moment.lerp_(update, 1 - beta1)
        if factored:
            instability = update.sub_(moment).square_().add_(eps2)  # update is spent
            _lerp_means(state[INSTABILITY_ROWS], state[INSTABILITY_COLUMNS], instability,
                        1 - group["beta3"])
            del update, instability
            step = _factored_rsqrt(state[INSTABILITY_ROWS],
                                   state[INSTABILITY_COLUMNS]).mul_(moment)
        else:
            del update
            step = moment
        if group["weight_decay"]:
            param.mul_(1 - group["lr"] * group["weight_decay"])
        param.add_(step, alpha=-group["lr"])


def _lerp_means(rows: torch.Tensor, columns: torch.Tensor, values: torch.Tensor,
                weight: float) -> None:
    """rows (..., n) and columns (..., m) moved towards the means of values (..., n, m)
    over its columns and its rows."""
    rows.lerp_(values.mean(dim=-1), weight)
    columns.lerp_(values.mean(dim=-2), weight)


def _factored_rsqrt(rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """1 / sqrt(rows columns^T / mean(rows)), (..., n, m): the reciprocal root of the
    factored estimate of a matrix whose row and column means these are."""
    row_factor = (rows / rows.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
    return row_factor * columns.unsqueeze(-2).rsqrt()
