"""How GaLore sees a weight: as a matrix oriented so that its smaller side is projected,
which weights are projected at what rank, the shapes of P, R and the state, and the state's
bytes. Functions of a parameter's shape and its group's options, shared by the optimizer
(optim/galore.py) and the planner (techniques/optimizers/galore.py, through GaLore's
static methods of the same names), and the maps between a weight and its oriented matrix.

Shapes: a weight viewed as rows x rest has gradient G; g is G (s x l) or G^T when G is
tall, s <= l; P is s x r and R = P^T g is r x l.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from memfit.optim.inner import Rows, row_chunks
from memfit.optim.inner import state_bytes as inner_state_bytes

# Projectors whose P is regenerated from a stored seed and whose update is the raw gradient
# scaled by how much the inner rule changed R (APOLLO, APOLLO-Mini).
RAW_GRADIENT_PROJECTORS: tuple[str, ...] = ("random", "apollo_mini")


def is_tall(shape: torch.Size) -> bool:
    """Whether a >= 2-D tensor of `shape`, viewed as rows x rest, has more rows than
    columns (its g is then the transposed matrix)."""
    return shape[0] > math.prod(shape[1:])



def oriented_matrix(tensor: torch.Tensor, whole_shape: torch.Size) -> torch.Tensor:
    """fp32 view of a >= 2-D tensor as a matrix oriented as the whole tensor's g (s x l):
    transposed when the whole tensor is tall. `tensor` is the whole tensor or some rows of
    it (possibly none; hence the explicit column count)."""
    matrix = tensor.reshape(tensor.shape[0], math.prod(whole_shape[1:])).float()
    return matrix.T if is_tall(whole_shape) else matrix



def from_oriented(update: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """Inverse of oriented_matrix for an s x l update: back to param's shape."""
    rows = param.shape[0]
    columns = param.numel() // rows
    return (update.T if rows > columns else update).reshape(param.shape)


def projected_back_by_rows(
    basis: torch.Tensor, direction: torch.Tensor, param: torch.Tensor, tall: bool
) -> Iterator[tuple[Rows, torch.Tensor]]:
    """from_oriented(P @ direction, param) one row chunk of param at a time (row_chunks), so
    the full-size fp32 update never exists. A wide param's rows are the rows of the
    update: chunk = P[rows] @ direction, with P the param's rows of the basis (rows x r)
    and direction r x l. A tall param's rows are the update's columns (oriented_matrix transposed
    it): chunk = (P @ direction[:, rows])^T, with P s x r and direction r x (param rows)."""
    for rows in row_chunks(param.shape):
        update = (basis @ direction[:, rows]).T if tall else basis[rows] @ direction
        yield rows, update.reshape(param[rows].shape)
        del update  # before the next chunk is computed


def projection(shape: tuple[int, ...], group: dict[str, Any]) -> tuple[int, int, int] | None:
    """(s, r, l) of a parameter of ``shape`` in ``group``: g is s x l (s <= l), P s x r
    and R r x l; None when it gets the plain inner update. The planner calls this too."""
    if len(shape) < 2:
        return None
    rows = shape[0]
    small, large = sorted((rows, math.prod(shape) // rows))
    rank = 1 if group["projector"] == "apollo_mini" else group["rank"]
    if group["project"] is None:
        return (small, rank, large) if small > rank else None
    return (small, min(rank, small), large) if group["project"] else None


def state_bytes(shape: tuple[int, ...], group: dict[str, Any]) -> int:
    """Bytes of the state kept for a parameter of ``shape`` in ``group`` (what
    state_dict holds after its first step; ints not counted)."""
    sides = projection(shape, group)
    if sides is None:
        return inner_state_bytes(shape, group["inner"])
    small, rank, large = sides
    moments = inner_state_bytes((rank, large), group["inner"])
    if group["projector"] in RAW_GRADIENT_PROJECTORS:
        return moments + 4  # P is a seed; the limiter's last norm, a 0-d fp32 tensor
    if group["projector"] == "online":  # P and its own fp32 Adam moments
        return moments + 3 * 4 * small * rank
    return moments + 4 * small * rank


def row_shard_state_bytes(shape: tuple[int, ...], group: dict[str, Any], rows: int) -> int:
    """Bytes of the state one process keeps for ``rows`` rows of a row-sharded (FSDP2)
    parameter of whole ``shape``, divided as state_placement says: an unprojected
    param's moments have its rows' shape; a projected one keeps P (s x r) whole, and its
    moments on R whole (r x l) when it is wide, r x rows when it is tall (its rows are
    columns of R). Shards step only projectors that keep P (svd, randomized_svd)."""
    sides = projection(shape, group)
    if sides is None:
        return inner_state_bytes((rows, *shape[1:]), group["inner"])
    small, rank, large = sides
    moments = inner_state_bytes((rank, rows if is_tall(shape) else large), group["inner"])
    return moments + 4 * small * rank


def accumulation_shape_of(shape: tuple[int, ...], group: dict[str, Any]) -> torch.Size | None:
    """Shape r x l of the projected gradient if gradients of a parameter of ``shape``
    can be accumulated in projected form, else None (unprojected, or a projector whose
    weight update needs the full gradient)."""
    sides = projection(shape, group)
    if sides is None or group["projector"] in RAW_GRADIENT_PROJECTORS:
        return None
    return torch.Size(sides[1:])
