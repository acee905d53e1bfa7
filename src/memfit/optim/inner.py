"""Inner update rules (AdamW, 8-bit AdamW, Adafactor) on a gradient-like tensor.

Each rule advances moment tensors kept in an optimizer's per-parameter state dict and
returns the fp32 *direction*; the caller multiplies it by the step size and applies it.
GaLore runs them on the projected gradient R (r x l); memfit's AdamW and GaLore's
unprojected parameters run them on the full gradient. State holds tensors and ints only.

Keys (with an optional prefix, e.g. "projector_" for the online projector's own Adam):
  inner_step                          int, steps since the moments were (re)started
  exp_avg, exp_avg_sq                 fp32 moments (adamw)
  exp_avg_codes/_absmax, ...          8-bit block-wise moments (adamw8bit)
  exp_avg_sq_row, exp_avg_sq_col      Adafactor factored second moment (>= 2-D)
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from memfit.optim.quantize import dequantize_blockwise, quantize_blockwise

InnerName = Literal["adamw", "adamw8bit", "adafactor"]
INNER_CHOICES: tuple[str, ...] = ("adamw", "adamw8bit", "adafactor")

# Adafactor (Shazeer & Stern 2018): beta2_t = 1 - t**-0.8 and update clipping at RMS 1.
_ADAFACTOR_DECAY = -0.8
_ADAFACTOR_CLIP = 1.0

_MOMENT_NAMES = ("exp_avg", "exp_avg_sq", "exp_avg_sq_row", "exp_avg_sq_col")


def _load(
    state: dict, name: str, like: torch.Tensor, shape: torch.Size, eight_bit: bool, signed: bool
) -> torch.Tensor:
    """The fp32 moment `name` (zeros if not yet created)."""
    if eight_bit:
        if name + "_codes" not in state:
            return torch.zeros(shape, dtype=torch.float32, device=like.device)
        return dequantize_blockwise(state[name + "_codes"], state[name + "_absmax"], shape, signed)
    if name not in state:
        state[name] = torch.zeros(shape, dtype=torch.float32, device=like.device)
    return state[name]


def _store(state: dict, name: str, value: torch.Tensor, eight_bit: bool, signed: bool) -> None:
    if eight_bit:
        state[name + "_codes"], state[name + "_absmax"] = quantize_blockwise(value, signed)
    else:
        state[name] = value


def adam_direction(
    state: dict,
    grad: torch.Tensor,
    betas: tuple[float, float],
    eps: float,
    eight_bit: bool = False,
    prefix: str = "",
) -> torch.Tensor:
    """Advance Adam moments with fp32 `grad` and return m_hat / (sqrt(v_hat) + eps).

    Same arithmetic as torch.optim.AdamW (lerp for m, bias-corrected denominator), so
    lr * direction equals torch's step up to float rounding.
    """
    beta1, beta2 = betas
    step = state.get(prefix + "inner_step", 0) + 1
    state[prefix + "inner_step"] = step
    exp_avg = _load(state, prefix + "exp_avg", grad, grad.shape, eight_bit, signed=True)
    exp_avg_sq = _load(state, prefix + "exp_avg_sq", grad, grad.shape, eight_bit, signed=False)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    _store(state, prefix + "exp_avg", exp_avg, eight_bit, signed=True)
    _store(state, prefix + "exp_avg_sq", exp_avg_sq, eight_bit, signed=False)
    bias_correction1 = 1 - beta1**step
    denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
    return exp_avg / bias_correction1 / denom


def adafactor_direction(state: dict, grad: torch.Tensor, eps: float) -> torch.Tensor:
    """Advance Adafactor's second moment with fp32 `grad`; return the clipped update.

    No first moment. For >= 2-D grads (viewed as rows x rest) the second moment is
    factored into a row vector and a column vector (r + l numbers instead of r * l);
    1-D grads keep a full second moment. beta2_t = 1 - t**-0.8 is 0 at t=1, so no bias
    correction is needed.
    """
    step = state.get("inner_step", 0) + 1
    state["inner_step"] = step
    beta2 = 1 - step**_ADAFACTOR_DECAY
    squared = grad * grad
    if grad.dim() >= 2:
        squared = squared.reshape(grad.shape[0], -1)
        row = _load(state, "exp_avg_sq_row", grad, squared.shape[:1], False, False)
        col = _load(state, "exp_avg_sq_col", grad, squared.shape[1:], False, False)
        row.lerp_(squared.mean(dim=1), 1 - beta2)
        col.lerp_(squared.mean(dim=0), 1 - beta2)
        # Rank-1 reconstruction: v[i, j] = row[i] * col[j] / mean(row).
        second_moment = (torch.outer(row, col) / row.mean()).view(grad.shape)
    else:
        second_moment = _load(state, "exp_avg_sq", grad, grad.shape, False, False)
        second_moment.lerp_(squared, 1 - beta2)
    update = grad / (second_moment.sqrt() + eps)
    rms = update.pow(2).mean().sqrt()
    return update / torch.clamp(rms / _ADAFACTOR_CLIP, min=1.0)


def inner_direction(
    state: dict, grad: torch.Tensor, inner: str, betas: tuple[float, float], eps: float
) -> torch.Tensor:
    """Dispatch to the named inner rule (names validated by the optimizer)."""
    if inner == "adafactor":
        return adafactor_direction(state, grad, eps)
    return adam_direction(state, grad, betas, eps, eight_bit=inner == "adamw8bit")


def reset_moments(state: dict) -> None:
    """Forget the moments and restart bias correction (subspace_change="reset")."""
    for name in _MOMENT_NAMES:
        for suffix in ("", "_codes", "_absmax"):
            state.pop(name + suffix, None)
    state.pop("inner_step", None)


def rotate_moments(
    state: dict, rotation: torch.Tensor, inner: str, moment_shape: torch.Size
) -> None:
    """Carry moments into a new subspace (subspace_change="reproject").

    `rotation` C (r x r) maps old projected coordinates to new ones: R_new ~= C @ R_old,
    acting on dim 0 of the r x l moments (`moment_shape`). The first moment maps
    linearly; an elementwise second moment maps with C**2 (exact if the old coordinates
    are uncorrelated). For Adafactor only the row factor (length r) is in the subspace.
    """
    squared = rotation * rotation
    if inner == "adafactor":
        if "exp_avg_sq_row" in state:
            state["exp_avg_sq_row"] = squared @ state["exp_avg_sq_row"]
        return
    eight_bit = inner == "adamw8bit"
    if "inner_step" not in state:
        return
    for name, signed, matrix in (("exp_avg", True, rotation), ("exp_avg_sq", False, squared)):
        value = _load(state, name, rotation, moment_shape, eight_bit, signed)
        _store(state, name, matrix @ value, eight_bit, signed)
