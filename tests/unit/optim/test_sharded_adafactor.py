"""memfit's Adafactor against torch.optim.Adafactor(foreach=False) as the oracle: unsharded
it is torch's step; on 2 processes, each stepping its FSDP2 rows of every parameter, the
rows and the state are the oracle's of the whole tensors."""

from __future__ import annotations

import copy

import pytest
import torch
from two_processes import on_two_processes

from memfit._utils.errors import ConfigError
from memfit.optim import Adafactor
from memfit.optim.row_shards import RowShard

# Rows over 2 processes, torch.chunk's division: (5, 3) is 3 + 2 rows, (1, 4) and (1,)
# leave process 1 none; (4, 3, 2, 2) is a conv weight (dims -2, -1 are not dim 0).
SHARDED_SHAPES = [(5, 3), (6, 4), (4, 3, 2, 2), (1, 4), (3,), (1,)]
STEPS = 4
# lr 0.6 makes rho = min(lr, 1 / sqrt(t)) take both sides over 4 steps.
OPTIONS = {"lr": 0.6, "d": 1.0}


def _whole_parameters(shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """Random matrices; zero vectors, whose RMS of 0 makes alpha take eps2 at step 1."""
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator) if len(shape) > 1 else torch.zeros(shape)
            for shape in shapes]


def _groups(params: list[torch.Tensor]) -> list[dict]:
    return [{"params": [p for p in params if p.dim() > 1], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() == 1], "eps": (1e-20, 1e-3)}]


def _gradients(shapes: list[tuple[int, ...]], step: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=generator) for shape in shapes]


def _step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor],
          grads: list[torch.Tensor]) -> None:
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad.clone()
    optimizer.step()


def _assert_states_equal(got: dict, expected: dict, **tolerance: float) -> None:
    assert got.keys() == expected.keys()
    for index, state in expected.items():
        assert got[index].keys() == state.keys(), index
        for key, value in state.items():
            assert got[index][key].dtype == value.dtype, (index, key)
            torch.testing.assert_close(got[index][key], value, **tolerance, msg=f"{index} {key}")


def test_unsharded_steps_are_torch_adafactors() -> None:
    shapes = [(5, 3), (7,), (4, 3, 2, 2), (1, 4)]
    ours = _whole_parameters(shapes)
    theirs = [p.clone() for p in ours]
    optimizer = Adafactor(_groups(ours), **OPTIONS)
    oracle = torch.optim.Adafactor(_groups(theirs), foreach=False, **OPTIONS)
    for step in range(STEPS):
        grads = _gradients(shapes, step)
        _step(optimizer, ours, grads)
        _step(oracle, theirs, grads)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)  # the same operations in the same order
    assert optimizer.state_dict()["param_groups"] == oracle.state_dict()["param_groups"]
    _assert_states_equal(optimizer.state_dict()["state"], oracle.state_dict()["state"],
                         rtol=0, atol=0)


@pytest.mark.parametrize("direction", ["memfit to torch", "torch to memfit"])
def test_state_dict_loads_into_the_other_and_steps_continue_alike(direction: str) -> None:
    shapes = [(5, 3), (7,), (4, 3, 2, 2)]
    first, second = _whole_parameters(shapes), _whole_parameters(shapes)
    make_memfit = lambda params: Adafactor(_groups(params), **OPTIONS)  # noqa: E731
    make_torch = lambda params: torch.optim.Adafactor(  # noqa: E731
        _groups(params), foreach=False, **OPTIONS)
    make_saver, make_loader = ((make_memfit, make_torch) if direction == "memfit to torch"
                               else (make_torch, make_memfit))
    saver = make_saver(first)
    for step in range(2):
        _step(saver, first, _gradients(shapes, step))
    loader = make_loader(second)
    for target, source in zip(second, first, strict=True):
        target.copy_(source)
    # A copy, as a checkpoint is: load_state_dict keeps tensors it needs not convert.
    loader.load_state_dict(copy.deepcopy(saver.state_dict()))
    for step in range(2, STEPS):
        grads = _gradients(shapes, step)
        _step(saver, first, grads)
        _step(loader, second, grads)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    _assert_states_equal(loader.state_dict()["state"], saver.state_dict()["state"],
                         rtol=0, atol=0)


_ALL_REDUCE_SIZES: list[int] = []  # of this process, in order


class _CountingShard(RowShard):
    """A RowShard that records the size of every all-reduce made through it."""

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        _ALL_REDUCE_SIZES.append(tensor.numel())
        return super().sum_(tensor)


def _check_row_shards_match_the_whole(rank: int) -> None:
    """On each of 2 processes: the oracle steps whole tensors, memfit the local rows."""
    shapes = SHARDED_SHAPES
    whole = _whole_parameters(shapes)
    shards = []
    for shape in shapes:
        shard = RowShard.of(shape, rank, 2)
        shards.append(_CountingShard(shard.full_shape, shard.start, shard.rows))
    rows = [shard.local(p).clone() for shard, p in zip(shards, whole, strict=True)]
    oracle = torch.optim.Adafactor(_groups(whole), foreach=False, **OPTIONS)
    optimizer = Adafactor(_groups(rows), **OPTIONS)
    optimizer.set_row_shards(dict(zip(rows, shards, strict=True)))
    for step in range(STEPS):
        grads = _gradients(shapes, step)
        _step(oracle, whole, grads)
        _step(optimizer, rows, [s.local(g) for s, g in zip(shards, grads, strict=True)])

    # Per step, in group order (the matrices, then the vectors): a 2-D parameter sums its
    # n column sums and its row_var sum, then every parameter its two squared norms.
    expected_sizes = []
    for shape in [s for s in shapes if len(s) > 1] + [s for s in shapes if len(s) == 1]:
        expected_sizes += ([shape[-1] + 1] if len(shape) == 2 else []) + [2]
    assert _ALL_REDUCE_SIZES == expected_sizes * STEPS

    # The whole-tensor sums add float32 partial sums in another order than torch: values
    # differ by a few ulps (at most 1e-6 relative, ~1e-7 absolute near 1, seen: half that).
    tolerance = {"rtol": 1e-6, "atol": 2e-7}
    for param, shard, local in zip(whole, shards, rows, strict=True):
        torch.testing.assert_close(local, shard.local(param), **tolerance)
        expected_state, state = oracle.state[param], optimizer.state[local]
        assert state.keys() == expected_state.keys()
        for key, value in expected_state.items():
            dim = optimizer.state_placement(local, key)
            expected = value if dim is None else shard.local(value, dim)
            assert state[key].dtype == expected.dtype, (param.shape, key)
            torch.testing.assert_close(state[key], expected, **tolerance,
                                       msg=f"{tuple(param.shape)} {key}")


def test_row_shards_on_two_processes_step_as_the_whole_tensors() -> None:
    on_two_processes(_check_row_shards_match_the_whole)


def test_state_placement_follows_the_rows() -> None:
    matrix, conv, vector = torch.zeros(4, 3), torch.zeros(2, 3, 2, 2), torch.zeros(3)
    optimizer = Adafactor([matrix, conv, vector])
    assert [optimizer.state_placement(matrix, key) for key in ("step", "row_var", "col_var")
            ] == [None, 0, None]
    assert [optimizer.state_placement(conv, key) for key in ("row_var", "col_var")] == [0, 0]
    assert optimizer.state_placement(vector, "variance") == 0
    with pytest.raises(KeyError):
        optimizer.state_placement(vector, "row_var")


def test_refuses_what_it_does_not_support() -> None:
    with pytest.raises(ConfigError, match="complex"):
        Adafactor([torch.zeros(2, dtype=torch.complex64)])
    with pytest.raises(ConfigError, match="d=0.5"):
        Adafactor([torch.zeros(2)], d=0.5)
    embedding = torch.zeros(4, 2, requires_grad=True)
    embedding.grad = torch.sparse_coo_tensor([[0]], torch.ones(1, 2), (4, 2),
                                             check_invariants=True)
    with pytest.raises(ConfigError, match="sparse"):
        Adafactor([embedding]).step()
    torch_state = torch.optim.Adafactor([torch.zeros(2)], maximize=True).state_dict()
    with pytest.raises(ConfigError, match="maximize"):
        Adafactor([torch.zeros(2)]).load_state_dict(torch_state)
    matrix = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="is not"):  # process 0 of 2 holds 2 rows of 4
        Adafactor([matrix]).set_row_shards({matrix: RowShard.of((4, 4), 0, 2)})
