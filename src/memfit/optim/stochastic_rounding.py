"""Stochastic rounding to bf16 and the shared "write an fp32 update into a param" step.

bf16 keeps 8 mantissa bits, so an update smaller than half a unit in the last place of the
weight is lost by round-to-nearest: long runs of small updates vanish. Stochastic rounding
rounds up with probability equal to the discarded fraction, so the rounded weight is an
unbiased estimate of the fp32 result and small updates survive on average.

Updates of large parameters arrive in row chunks (memfit.optim.inner.row_chunks) and are
written chunk by chunk (`apply_updates_by_rows_`), so the fp32 copy of a bf16 weight and
its rounding noise exist for one chunk at a time, not for the whole 8000 x 768 embedding.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from memfit.optim.inner import Rows

_MASK64 = (1 << 64) - 1


def mix_seed(*values: int) -> int:
    """Combine integers into one well-mixed 63-bit seed (splitmix64 finaliser).

    Used to derive independent, reproducible random streams per (seed, parameter, step)
    without storing generator state in the optimizer.
    """
    h = 0x9E3779B97F4A7C15
    for value in values:
        h = (h ^ (value & _MASK64)) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h & ((1 << 63) - 1)


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    """A generator on `device` seeded with `seed` (CPU and CUDA streams differ, each is fixed)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def stochastic_round_to_bf16(
    x: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Round an fp32 tensor to bf16, up or down with probability proportional to distance.

    bf16 is the upper 16 bits of fp32. Adding a uniform random integer in [0, 2**16) to the
    bit pattern and truncating the low 16 bits rounds the magnitude up exactly with
    probability (discarded bits) / 2**16; sign-magnitude encoding makes this correct for
    negative values too. inf stays inf (its low bits are zero and are masked off again).
    """
    if x.dtype != torch.float32:
        raise TypeError(f"stochastic_round_to_bf16 expects float32, got {x.dtype}")
    return _round_low_bits_(x.clone(), generator).to(torch.bfloat16)


def _round_low_bits_(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """In place: fp32 `x` rounded stochastically to a value bf16 holds exactly (low 16 bits
    zero), so a later cast to bf16 is exact. One int32 temporary: the noise."""
    bits = x.view(torch.int32)
    bits.add_(
        torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device, generator=generator)
    )
    bits.bitwise_and_(-65536)  # -65536 == 0xFFFF0000 as int32
    return x


def _updated(
    param: torch.Tensor, update: torch.Tensor, step_size: float, decay_factor: float
) -> torch.Tensor | None:
    """fp32 `param` updated in place (None); otherwise the updated fp32 values (new)."""
    if param.dtype == torch.float32:
        if decay_factor != 1.0:
            param.mul_(decay_factor)
        param.add_(update, alpha=-step_size)
        return None
    master = param.float()
    if decay_factor != 1.0:
        master.mul_(decay_factor)
    master.add_(update, alpha=-step_size)
    return master


def _write_back_(param: torch.Tensor, master: torch.Tensor, seed: int) -> None:
    if param.dtype == torch.bfloat16:
        _round_low_bits_(master, make_generator(seed, param.device))
    param.copy_(master)


@torch.no_grad()
def apply_updates_by_rows_(
    param: torch.Tensor,
    updates: Iterable[tuple[Rows, torch.Tensor]],
    step_size: float,
    decay_factor: float,
    seed: int,
) -> None:
    """param[rows] <- param[rows] * decay_factor - step_size * update for each (rows,
    update) chunk, in order, computed in fp32.

    `update` is fp32 with param[rows]'s shape (rows `...`: the whole param, one piece). fp32
    params are updated in place in the same order as torch.optim.AdamW (decay, then add).
    bf16 params are widened to fp32, updated, and written back with stochastic rounding;
    other dtypes round to nearest.

    `updates` is typically a generator computing each chunk on demand (see
    memfit.optim.inner.inner_directions_by_rows). Each chunk is dropped as soon as it has
    been added to the fp32 weight, before the rounding noise exists and before the next
    chunk is asked for: at most two chunk-sized temporaries at a time here. One piece
    (rows `...`) rounds with `seed` itself; chunk i of several with mix_seed(seed, i):
    deterministic and resumable, independent across chunks.
    """
    # No enumerate(): its cached result tuple would keep the previous chunk alive while the
    # next one is computed.
    index = 0
    for rows, update in updates:
        target = param[rows]
        master = _updated(target, update, step_size, decay_factor)
        del update
        if master is not None:
            _write_back_(target, master, seed if rows is ... else mix_seed(seed, index))
        del master
        index += 1
