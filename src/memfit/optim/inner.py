"""Inner update rules (AdamW, 8-bit AdamW, Adafactor) on a gradient-like tensor.

Each rule advances moment tensors kept in an optimizer's per-parameter state dict and
returns the fp32 *direction*; the caller multiplies it by the step size and applies it.
GaLore runs them on the projected gradient R (r x l); memfit's AdamW and GaLore's
unprojected parameters run them on the full gradient. State holds tensors and ints only.

Large parameters are processed in row chunks (`inner_directions_by_rows`). Done in one
piece, the update of an 8000 x 768 embedding or head keeps several full-size fp32
temporaries alive together (23.4 MiB each: the widened bf16 gradient, g**2, sqrt(v), the
direction, then the fp32 copy of a bf16 weight and its rounding noise). A chunk
is whole rows of dim 0 holding about CHUNK_ELEMENTS values (2**20: 4 MiB of fp32), so only
chunk-sized temporaries exist at a time; the caller applies each chunk's direction before
the next is computed. Tensors of at most CHUNK_ELEMENTS values, and 1-D tensors, are one
piece and computed exactly as without chunking.
  adamw      elementwise: a chunk reads and updates row slices (views) of the moments.
  adamw8bit  elementwise too; chunks hold a whole number of quantisation blocks, so their
             codes/absmax are slices of the tensor's and the result equals one piece.
  adafactor  not separable: the column factor needs every row and the update is clipped
             by its global RMS. Pass 1 collects row and column means of g**2, pass 2 the
             RMS of the update, pass 3 recomputes each chunk's update (cheap, elementwise)
             and yields it clipped. Equal to one piece up to the rounding of those sums.

Keys (with an optional prefix, e.g. "projector_" for the online projector's own Adam):
  inner_step                          int, steps since the moments were (re)started
  exp_avg, exp_avg_sq                 fp32 moments (adamw)
  exp_avg_codes/_absmax, ...          8-bit block-wise moments (adamw8bit)
  exp_avg_sq_row, exp_avg_sq_col      Adafactor factored second moment (>= 2-D)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import EllipsisType

import torch

from memfit.config.choices import GaloreInner
from memfit.optim.quantize import (
    BLOCK_SIZE,
    dequantize_blockwise,
    quantize_blockwise,
    quantized_bytes,
    quantized_zeros,
)

# The inner rules by name: config.choices.GaloreInner's values (optimizer.galore.inner).
INNER_CHOICES: tuple[str, ...] = tuple(inner.value for inner in GaloreInner)

# Adafactor (Shazeer & Stern 2018): beta2_t = 1 - t**-0.8 and update clipping at RMS 1.
_ADAFACTOR_DECAY = -0.8
_ADAFACTOR_CLIP = 1.0

_MOMENT_NAMES = ("exp_avg", "exp_avg_sq", "exp_avg_sq_row", "exp_avg_sq_col")

# Values (fp32: 4 MiB) per row chunk of a large parameter's update.
CHUNK_ELEMENTS = 1 << 20

# fp32 row chunks alive at once in a chunked update (measured by
# tests/unit/optim/test_optim_chunked_updates.py: at most 2 for adamw, 2.25 for adafactor,
# 4.5 for 8-bit moments, which decode both moments and encode them again).
_CHUNKS_ALIVE = {GaloreInner.ADAMW: 2, GaloreInner.ADAFACTOR: 3, GaloreInner.ADAMW8BIT: 5}

# Rows of dim 0 a chunk covers; `...` is the whole tensor in one piece.
Rows = slice | EllipsisType


def row_chunks(shape: torch.Size, rows_multiple: int = 1) -> list[Rows]:
    """Row slices of dim 0 covering a tensor of `shape`, about CHUNK_ELEMENTS values each
    (at least one row; a multiple of `rows_multiple` rows except the last chunk).
    [...] (one piece) for tensors of at most CHUNK_ELEMENTS values and for 0-/1-D ones."""
    numel = math.prod(shape)
    if len(shape) < 2 or numel <= CHUNK_ELEMENTS:
        return [...]
    rows_per_chunk = max(1, CHUNK_ELEMENTS // (numel // shape[0]))
    rows_per_chunk = max(rows_multiple, rows_per_chunk // rows_multiple * rows_multiple)
    if rows_per_chunk >= shape[0]:
        return [...]
    return [slice(start, min(start + rows_per_chunk, shape[0]))
            for start in range(0, shape[0], rows_per_chunk)]


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


class _RowMoment:
    """One moment with the gradient's shape, read and written a row chunk at a time.

    fp32: a chunk is a view of the state tensor, updated in place. 8-bit: the chunk's
    values [start, stop) of the flattened tensor are whole quantisation blocks (the last
    chunk also owns the padding), so they decode from and encode into slices of the codes
    and absmax.
    """

    def __init__(
        self, state: dict, name: str, grad: torch.Tensor, eight_bit: bool, signed: bool
    ) -> None:
        self.state, self.name, self.eight_bit, self.signed = state, name, eight_bit, signed
        self.shape = grad.shape
        if not eight_bit:
            _load(state, name, grad, grad.shape, False, signed)  # creates zeros if missing
        elif name + "_codes" not in state:
            state[name + "_codes"], state[name + "_absmax"] = quantized_zeros(
                grad.numel(), signed, grad.device
            )

    def _blocks(self, rows: Rows) -> slice:
        if rows is ...:
            return slice(0, None)
        row_length = math.prod(self.shape) // self.shape[0]
        start = rows.start * row_length  # a block boundary (see inner_directions_by_rows)
        stop = rows.stop * row_length
        return slice(start // BLOCK_SIZE, -(-stop // BLOCK_SIZE))

    def load(self, rows: Rows, shape: torch.Size) -> torch.Tensor:
        if not self.eight_bit:
            return self.state[self.name][rows]
        blocks = self._blocks(rows)
        codes = self.state[self.name + "_codes"].view(-1, BLOCK_SIZE)[blocks].view(-1)
        absmax = self.state[self.name + "_absmax"][blocks]
        return dequantize_blockwise(codes, absmax, shape, self.signed)

    def store(self, rows: Rows, value: torch.Tensor) -> None:
        if not self.eight_bit:
            return  # `value` is a view of the state tensor, already updated in place
        blocks = self._blocks(rows)
        codes, absmax = quantize_blockwise(value, self.signed)
        self.state[self.name + "_codes"].view(-1, BLOCK_SIZE)[blocks].view(-1).copy_(codes)
        self.state[self.name + "_absmax"][blocks].copy_(absmax)


def _adam_by_rows(
    state: dict,
    grad: torch.Tensor,
    betas: tuple[float, float],
    eps: float,
    eight_bit: bool,
    prefix: str,
    chunks: list[Rows],
) -> Iterator[tuple[Rows, torch.Tensor]]:
    beta1, beta2 = betas
    step = state.get(prefix + "inner_step", 0) + 1
    state[prefix + "inner_step"] = step
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = math.sqrt(1 - beta2**step)
    first = _RowMoment(state, prefix + "exp_avg", grad, eight_bit, signed=True)
    second = _RowMoment(state, prefix + "exp_avg_sq", grad, eight_bit, signed=False)

    def direction_of(rows: Rows) -> torch.Tensor:
        g = grad[rows].float()
        exp_avg = first.load(rows, g.shape)
        exp_avg_sq = second.load(rows, g.shape)
        exp_avg.lerp_(g, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        del g
        first.store(rows, exp_avg)
        second.store(rows, exp_avg_sq)
        if eight_bit:  # the chunks are fresh decoded copies, already stored: reuse them
            denom = exp_avg_sq.sqrt_().div_(bias_correction2_sqrt).add_(eps)
            return exp_avg.div_(bias_correction1).div_(denom)
        denom = exp_avg_sq.sqrt().div_(bias_correction2_sqrt).add_(eps)
        return torch.div(exp_avg, bias_correction1).div_(denom)

    # Computed in a function so that nothing but the direction stays alive (in no local of
    # this generator) while the caller applies it.
    for rows in chunks:
        yield rows, direction_of(rows)


def adam_direction(
    state: dict,
    grad: torch.Tensor,
    betas: tuple[float, float],
    eps: float,
    eight_bit: bool = False,
    prefix: str = "",
) -> torch.Tensor:
    """Advance Adam moments with `grad` and return m_hat / (sqrt(v_hat) + eps) (fp32).

    Same arithmetic as torch.optim.AdamW (lerp for m, bias-corrected denominator), so
    lr * direction equals torch's step up to float rounding. One piece, whatever the size.
    """
    return _one_piece(_adam_by_rows(state, grad, betas, eps, eight_bit, prefix, [...]))


def _adafactor_by_rows(
    state: dict, grad: torch.Tensor, eps: float, chunks: list[Rows]
) -> Iterator[tuple[Rows, torch.Tensor]]:
    step = state.get("inner_step", 0) + 1
    state["inner_step"] = step
    beta2 = 1 - step**_ADAFACTOR_DECAY
    if grad.dim() < 2:
        yield ..., _adafactor_unfactored(state, grad.float(), beta2, eps)
        return

    def matrix(rows: Rows) -> torch.Tensor:  # fp32 grad rows as k x l
        chunk = grad[rows].float()
        return chunk.reshape(chunk.shape[0], -1)

    # Pass 1: mean of g**2 over each row (r,) and over all rows (l,), the latter as the sum
    # of chunk means weighted by their share of the rows (exactly the mean for one piece).
    rows_total, numel = grad.shape[0], grad.numel()
    row = _load(state, "exp_avg_sq_row", grad, grad.shape[:1], False, False)
    col = _load(state, "exp_avg_sq_col", grad, torch.Size((numel // rows_total,)), False, False)
    row_mean = torch.empty_like(row)
    col_mean = torch.zeros_like(col)
    for rows in chunks:
        g = matrix(rows)
        squared = g * g
        row_mean[rows] = squared.mean(dim=1)
        col_mean.add_(squared.mean(dim=0), alpha=g.shape[0] / rows_total)
        del g, squared
    row.lerp_(row_mean, 1 - beta2)
    col.lerp_(col_mean, 1 - beta2)
    del row_mean, col_mean
    row_average = row.mean()

    def update_of(rows: Rows) -> torch.Tensor:
        # Rank-1 reconstruction: v[i, j] = row[i] * col[j] / mean(row).
        denominator = torch.outer(row[rows], col).div_(row_average).sqrt_().add_(eps)
        return torch.div(matrix(rows), denominator, out=denominator)

    # Pass 2: RMS of the whole update, from chunk mean squares weighted by their share.
    # One piece keeps its update for pass 3 instead of recomputing it.
    mean_squares, kept = [], []
    for rows in chunks:
        update = update_of(rows)
        mean_squares.append(update.pow(2).mean() * (update.numel() / numel))
        if len(chunks) == 1:
            kept.append(update)
        del update
    scale = torch.clamp(torch.stack(mean_squares).sum().sqrt() / _ADAFACTOR_CLIP, min=1.0)
    # Pass 3: the clipped update, chunk by chunk (no local holds it while the caller works).
    for rows in chunks:
        yield rows, (kept.pop() if kept else update_of(rows)).div_(scale).view(grad[rows].shape)


def _adafactor_unfactored(
    state: dict, grad: torch.Tensor, beta2: float, eps: float
) -> torch.Tensor:
    """Adafactor with a full second moment (0-/1-D grads), in one piece."""
    second_moment = _load(state, "exp_avg_sq", grad, grad.shape, False, False)
    second_moment.lerp_(grad * grad, 1 - beta2)
    update = grad / (second_moment.sqrt() + eps)
    rms = update.pow(2).mean().sqrt()
    return update / torch.clamp(rms / _ADAFACTOR_CLIP, min=1.0)


def adafactor_direction(state: dict, grad: torch.Tensor, eps: float) -> torch.Tensor:
    """Advance Adafactor's second moment with `grad`; return the clipped update (fp32).

    No first moment. For >= 2-D grads (viewed as rows x rest) the second moment is
    factored into a row vector and a column vector (r + l numbers instead of r * l);
    1-D grads keep a full second moment. beta2_t = 1 - t**-0.8 is 0 at t=1, so no bias
    correction is needed. One piece, whatever the size.
    """
    return _one_piece(_adafactor_by_rows(state, grad, eps, [...]))


def _one_piece(directions: Iterator[tuple[Rows, torch.Tensor]]) -> torch.Tensor:
    ((_, direction),) = directions
    return direction


def inner_directions_by_rows(
    state: dict, grad: torch.Tensor, inner: str, betas: tuple[float, float], eps: float
) -> Iterator[tuple[Rows, torch.Tensor]]:
    """Advance the named inner rule with `grad` (any float dtype; widened to fp32 a chunk at
    a time) and yield (rows, fp32 direction of grad[rows]) for the chunks of row_chunks.

    Apply each direction before asking for the next: only one chunk's temporaries are
    alive at a time. The state advances by one step, however many chunks there are, and
    is complete once the iterator is exhausted.
    """
    if inner == GaloreInner.ADAFACTOR:
        return _adafactor_by_rows(state, grad, eps, row_chunks(grad.shape))
    eight_bit = inner == GaloreInner.ADAMW8BIT
    # 8-bit chunks must start on a block boundary: rows_multiple * row_length % BLOCK_SIZE == 0.
    row_length = grad.numel() // grad.shape[0] if grad.dim() >= 2 and grad.shape[0] else 1
    rows_multiple = BLOCK_SIZE // math.gcd(row_length, BLOCK_SIZE) if eight_bit else 1
    chunks = row_chunks(grad.shape, rows_multiple)
    return _adam_by_rows(state, grad, betas, eps, eight_bit, "", chunks)


def state_bytes(shape: tuple[int, ...], inner: str) -> int:
    """Bytes of the moments the named rule keeps for a gradient of ``shape`` (the keys
    above; ``inner_step`` is an int): adamw two fp32 tensors, adamw8bit two quantised
    ones, adafactor the row and column means of a >= 2-D gradient viewed as rows x rest."""
    numel = math.prod(shape)
    if inner == GaloreInner.ADAMW8BIT:
        return 2 * quantized_bytes(numel)
    if inner == GaloreInner.ADAFACTOR:
        return 4 * (shape[0] + numel // shape[0]) if len(shape) >= 2 else 4 * numel
    return 8 * numel


def chunked_update_scratch_bytes(numel: int, inner: str) -> int:
    """Peak temporaries of ``inner_directions_by_rows`` and applying its chunks for a
    parameter of ``numel`` values (the planner's figure for it)."""
    return _CHUNKS_ALIVE[GaloreInner(inner)] * 4 * min(numel, CHUNK_ELEMENTS)


def inner_direction(
    state: dict, grad: torch.Tensor, inner: str, betas: tuple[float, float], eps: float
) -> torch.Tensor:
    """The named inner rule's direction for all of `grad`, in one piece (names validated
    by the optimizer)."""
    if inner == GaloreInner.ADAFACTOR:
        return adafactor_direction(state, grad, eps)
    return adam_direction(state, grad, betas, eps, eight_bit=inner == GaloreInner.ADAMW8BIT)


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

    A share 1 - sum_j C_ij**2 of new direction i lies outside the old subspace, and C**2
    gives that share no second moment: with bias correction long finished, such a
    direction's first steps would be several times too large. It gets that share of the
    old second moment's mean over directions instead (per column), so every direction
    starts at about the right scale (benchmarks/projector_refresh.py measures the effect).
    """
    squared = rotation * rotation
    unseen = (1 - squared.sum(dim=1)).clamp_(min=0)  # (r,) share outside the old subspace
    if inner == GaloreInner.ADAFACTOR:
        if "exp_avg_sq_row" in state:
            row = state["exp_avg_sq_row"]
            state["exp_avg_sq_row"] = squared @ row + unseen * row.mean()
        return
    eight_bit = inner == GaloreInner.ADAMW8BIT
    if "inner_step" not in state:
        return
    for name, signed, matrix in (("exp_avg", True, rotation), ("exp_avg_sq", False, squared)):
        value = _load(state, name, rotation, moment_shape, eight_bit, signed)
        rotated = matrix @ value
        if not signed:  # the second moment
            rotated.add_(unseen[:, None] * value.mean(dim=0))
        _store(state, name, rotated, eight_bit, signed)
