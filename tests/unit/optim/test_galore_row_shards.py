"""GaLore on row shards (FSDP2's division of dim 0) against GaLore on the whole tensors.

Each two-process check builds the same whole parameters and gradients in both processes,
steps an oracle GaLore on the whole tensors and a sharded GaLore on each process's rows
(RowShard.of(shape, rank, 2)), and compares the rows and the state (narrowed along
state_placement) with the oracle's.
"""

from __future__ import annotations

import pytest
import torch

from memfit._utils.errors import ConfigError
from memfit.optim import GaLore
from memfit.optim.row_shards import RowShard
from tests.unit.optim.two_processes import on_two_processes

STEPS = 5
OPTIONS = {"lr": 1e-2, "rank": 2, "update_gap": 2, "scale": 0.5, "weight_decay": 0.1}
# Wide, tall, uneven divisions (7 rows: 4 + 3) and a 1-D param, projected as GaLore
# decides; a 1-row param (the second process holds none of it) projected at rank 1.
SHAPES = [(6, 10), (10, 6), (7, 12), (12, 7), (9,)]
FORCED_SHAPES = [(1, 8), (1,)]


def _groups(params: list[torch.Tensor]) -> list[dict]:
    return [{"params": params[:len(SHAPES)]},
            {"params": params[len(SHAPES):], "project": True}]


def _whole_params() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator) for shape in SHAPES + FORCED_SHAPES]


def _gradients(step: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(shape, generator=generator) for shape in SHAPES + FORCED_SHAPES]


def _optimizers(rank: int, **options) -> tuple[GaLore, list[torch.Tensor], GaLore,
                                               list[torch.Tensor], list[RowShard]]:
    """(oracle, its whole params, sharded, this process's rows, their shards)."""
    whole = _whole_params()
    shards = [RowShard.of(param.shape, rank, 2) for param in whole]
    local = [shard.local(param).clone() for shard, param in zip(shards, whole, strict=True)]
    oracle = GaLore(_groups(whole), **OPTIONS, **options)
    sharded = GaLore(_groups(local), **OPTIONS, **options)
    sharded.set_row_shards(dict(zip(local, shards, strict=True)))
    return oracle, whole, sharded, local, shards


def _assert_matches(oracle: GaLore, whole: list[torch.Tensor], sharded: GaLore,
                    local: list[torch.Tensor], shards: list[RowShard], context: str) -> None:
    for index, (param, rows, shard) in enumerate(zip(whole, local, shards, strict=True)):
        where = f"{context}, param {index} {tuple(param.shape)}"
        torch.testing.assert_close(rows, shard.local(param), atol=1e-5, rtol=1e-5, msg=where)
        expected_state, state = oracle.state[param], sharded.state[rows]
        assert state.keys() == expected_state.keys(), where
        for key, expected in expected_state.items():
            placement = sharded.state_placement(rows, key)
            if placement is not None:
                expected = shard.local(expected, placement)
            if isinstance(expected, torch.Tensor):
                torch.testing.assert_close(state[key], expected, atol=1e-5, rtol=1e-5,
                                           msg=f"{where}, state {key!r}")
            else:
                assert state[key] == expected, f"{where}, state {key!r}"


def _check_steps(rank: int, projector: str) -> None:
    """step() on the rows equals step() on the whole tensors, for every subspace_change."""
    for subspace_change in ("keep", "reset", "reproject"):
        oracle, whole, sharded, local, shards = _optimizers(
            rank, projector=projector, subspace_change=subspace_change)
        for step in range(STEPS):
            for param, rows, shard, grad in zip(whole, local, shards, _gradients(step),
                                                strict=True):
                param.grad = grad.clone()
                rows.grad = shard.local(grad).clone()
            oracle.step()
            sharded.step()
            _assert_matches(oracle, whole, sharded, local, shards,
                            f"{projector}, {subspace_change}, step {step}")
        _assert_state_bytes_as_planned(sharded, whole, local, shards)


def _assert_state_bytes_as_planned(sharded: GaLore, whole: list[torch.Tensor],
                                   local: list[torch.Tensor], shards: list[RowShard]) -> None:
    """The planner's row_shard_state_bytes is the bytes this process's state holds."""
    for param, rows, shard in zip(whole, local, shards, strict=True):
        held = sum(value.numel() * value.element_size()
                   for value in sharded.state[rows].values() if isinstance(value, torch.Tensor))
        planned = GaLore.row_shard_state_bytes(tuple(param.shape), sharded.locate(rows)[0],
                                               shard.rows)
        assert planned == held, (tuple(param.shape), shard.rows)


def _check_layerwise(rank: int, projector: str) -> None:
    """project_gradient of two micro-batches, summed, then step_projected: on the rows as
    on the whole tensors (R complete for the param's layout, of accumulation_shape)."""
    oracle, whole, sharded, local, shards = _optimizers(rank, projector=projector)
    projected = [i for i, rows in enumerate(local)
                 if sharded.accumulation_shape(rows) is not None]
    assert len(projected) == 5  # all but the 1-D params
    for step in range(STEPS):
        micro_batches = (_gradients(2 * step), _gradients(2 * step + 1))
        for i in projected:
            param, rows, shard = whole[i], local[i], shards[i]
            assert sharded.backward_projection_basis(rows) is None
            expected = sum(oracle.project_gradient(param, grads[i]) for grads in micro_batches)
            summed = sum(sharded.project_gradient(rows, shard.local(grads[i]))
                         for grads in micro_batches)
            assert summed.shape == sharded.accumulation_shape(rows)
            oracle.step_projected(param, expected)
            sharded.step_projected(rows, summed)
            if sharded.state_placement(rows, "exp_avg") == 1:  # tall: its rows' columns of R
                expected = shard.local(expected, 1)
            torch.testing.assert_close(summed, expected, atol=1e-5, rtol=1e-5)
        _assert_matches(oracle, whole, sharded, local, shards,
                        f"{projector}, layer-wise, step {step}")


def _check_against_whole(rank: int, projector: str) -> None:
    _check_steps(rank, projector)
    _check_layerwise(rank, projector)


@pytest.mark.parametrize("projector", ["svd", "randomized_svd"])
def test_row_shards_step_as_the_whole_tensor(projector: str) -> None:
    on_two_processes(_check_against_whole, projector)


def _one_sharded_param(shape: tuple[int, ...], **options) -> tuple[GaLore, torch.Tensor]:
    """A GaLore over rank 0's rows of a whole tensor of `shape` (no collectives made)."""
    shard = RowShard.of(shape, 0, 2)
    rows = torch.zeros(shard.rows, *shape[1:])
    optimizer = GaLore([rows], **{**OPTIONS, **options})
    optimizer.set_row_shards({rows: shard})
    return optimizer, rows


@pytest.mark.parametrize("option,value", [
    ("projector", "online"), ("projector", "random"), ("projector", "apollo_mini"),
    ("inner", "adamw8bit"), ("inner", "adafactor"),
])
def test_options_that_need_the_whole_gradient_are_rejected(option: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"{option}='{value}'.*one of: "):
        _one_sharded_param((6, 10), **{option: value})


def test_rows_that_do_not_fit_the_shard_are_rejected() -> None:
    rows = torch.zeros(4, 10)
    optimizer = GaLore([rows], **OPTIONS)
    with pytest.raises(ValueError, match="rows 0:3 of a tensor of shape"):
        optimizer.set_row_shards({rows: RowShard.of((6, 10), 0, 2)})


@pytest.mark.parametrize("shape,placements", [
    ((6, 10), {"exp_avg": None, "exp_avg_sq": None, "projector": None}),
    ((10, 6), {"exp_avg": 1, "exp_avg_sq": 1, "projector": None}),
    ((9,), {"exp_avg": 0, "exp_avg_sq": 0}),
    ((6, 2), {"exp_avg": 0, "exp_avg_sq": 0}),  # smaller side 2 <= rank: unprojected
], ids=["wide", "tall", "1-D", "unprojected"])
def test_state_placement(shape: tuple[int, ...], placements: dict) -> None:
    optimizer, rows = _one_sharded_param(shape)
    for key, placement in {**placements, "step": None, "inner_step": None}.items():
        assert optimizer.state_placement(rows, key) == placement, key
    with pytest.raises(KeyError, match="update_norm"):
        optimizer.state_placement(rows, "update_norm")


def test_projection_and_accumulation_follow_the_whole_shape() -> None:
    wide, wide_rows = _one_sharded_param((7, 12))  # rank 0 holds 4 of 7 rows
    tall, tall_rows = _one_sharded_param((12, 7))  # 6 of 12
    small, small_rows = _one_sharded_param((3, 8))  # 2 of 3 rows
    assert wide.accumulation_shape(wide_rows) == (2, 12)
    assert tall.accumulation_shape(tall_rows) == (2, 6)
    # Projected, although rows of 2 x 8 alone would not be (smaller side 2 <= rank).
    assert small.accumulation_shape(small_rows) == (2, 8)
