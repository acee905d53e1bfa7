"""Row-chunked updates of large parameters equal the one-piece computation.

CHUNK_ELEMENTS is shrunk so a 70 x 48 parameter splits into several chunks; "one piece"
is the same run with a budget larger than the parameter.
"""

from __future__ import annotations

import io
import math

import pytest
import torch

from memfit.monitor.tensor_tracker import TensorTracker
from memfit.optim import AdamW, GaLore
from memfit.optim import inner as inner_module
from memfit.optim.inner import INNER_CHOICES, inner_directions_by_rows, row_chunks
from memfit.optim.quantize import BLOCK_SIZE

SHAPE = (70, 48)  # 3360 values, not a whole number of 256-value quantisation blocks
SMALL_BUDGET = 1000  # 20 rows per chunk (16 for 8-bit moments: 16 * 48 = 3 blocks)
ONE_PIECE = 1 << 40
STEPS = 5
INNERS = INNER_CHOICES  # every inner rule a config can name


def _gradients(shape: tuple[int, ...], steps: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    # Rows of very different scale, so Adafactor's row and column factors matter.
    scale = torch.logspace(-2, 1, shape[0]).reshape(-1, *([1] * (len(shape) - 1)))
    return [torch.randn(shape, generator=generator) * scale for _ in range(steps)]


def _initial(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    # bf16 values, so that fp32 runs are the exact master of the bf16 ones.
    return torch.randn(shape, generator=generator).to(torch.bfloat16).to(dtype)


def _galore_run(
    monkeypatch: pytest.MonkeyPatch,
    budget: int,
    inner: str,
    dtype: torch.dtype,
    shape: tuple[int, ...] = SHAPE,
    project: bool = False,
) -> tuple[torch.Tensor, GaLore]:
    monkeypatch.setattr(inner_module, "CHUNK_ELEMENTS", budget)
    param = torch.nn.Parameter(_initial(shape, dtype))
    optimizer = GaLore([param], lr=1e-2, inner=inner, weight_decay=0.1, project=project,
                       rank=4, projector="randomized_svd", update_gap=2, seed=3)
    for grad in _gradients(shape, STEPS):
        param.grad = grad.to(dtype)
        optimizer.step()
    return param.detach(), optimizer


def _state_tensors(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    (state,) = optimizer.state.values()
    return {key: value for key, value in state.items() if isinstance(value, torch.Tensor)}


def test_row_chunks_cover_rows_in_budget_sized_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inner_module, "CHUNK_ELEMENTS", SMALL_BUDGET)
    chunks = row_chunks(torch.Size(SHAPE))
    assert [(rows.start, rows.stop) for rows in chunks] == [
        (0, 20), (20, 40), (40, 60), (60, 70)]
    aligned = row_chunks(torch.Size(SHAPE), rows_multiple=16)
    assert [rows.start * SHAPE[1] % BLOCK_SIZE for rows in aligned] == [0] * len(aligned)
    assert aligned[-1].stop == SHAPE[0]
    # At most the budget, 1-D, and a row longer than the budget (one row per chunk).
    assert row_chunks(torch.Size((20, 50))) == [...]
    assert row_chunks(torch.Size((5000,))) == [...]
    assert len(row_chunks(torch.Size((3, 2000)))) == 3


@pytest.mark.parametrize("inner", INNERS)
@pytest.mark.parametrize("project", [False, True], ids=["full", "projected"])
def test_fp32_chunked_equals_one_piece(
    monkeypatch: pytest.MonkeyPatch, inner: str, project: bool
) -> None:
    chunked, chunked_optimizer = _galore_run(
        monkeypatch, SMALL_BUDGET, inner, torch.float32, project=project)
    whole, whole_optimizer = _galore_run(
        monkeypatch, ONE_PIECE, inner, torch.float32, project=project)
    chunked_state = _state_tensors(chunked_optimizer)
    whole_state = _state_tensors(whole_optimizer)
    assert chunked_state.keys() == whole_state.keys()
    exact = inner != "adafactor" and not project  # elementwise rules, no split matmul
    for key, value in whole_state.items():
        if exact:
            assert torch.equal(chunked_state[key], value), key
        else:
            torch.testing.assert_close(chunked_state[key], value, rtol=1e-5, atol=1e-7)
    if exact:
        assert torch.equal(chunked, whole)
    else:
        torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)
    (state,) = chunked_optimizer.state.values()
    assert state["inner_step"] == STEPS and state["step"] == STEPS  # once per step


@pytest.mark.parametrize("inner", INNERS)
def test_bf16_chunked_tracks_fp32_like_one_piece(
    monkeypatch: pytest.MonkeyPatch, inner: str
) -> None:
    master, _ = _galore_run(monkeypatch, ONE_PIECE, inner, torch.float32)
    chunked, chunked_optimizer = _galore_run(monkeypatch, SMALL_BUDGET, inner, torch.bfloat16)
    again, _ = _galore_run(monkeypatch, SMALL_BUDGET, inner, torch.bfloat16)
    whole, whole_optimizer = _galore_run(monkeypatch, ONE_PIECE, inner, torch.bfloat16)
    assert torch.equal(chunked, again)  # per-chunk seeds: deterministic
    assert not torch.equal(chunked, whole)  # ... and not the one-piece stream
    # The moments see the same gradients whatever the weights' rounding.
    chunked_state, whole_state = _state_tensors(chunked_optimizer), _state_tensors(whole_optimizer)
    for key, value in whole_state.items():
        if inner == "adafactor":
            torch.testing.assert_close(chunked_state[key], value, rtol=1e-5, atol=0)
        else:
            assert torch.equal(chunked_state[key], value), key
    # Stochastic rounding against the fp32 master: a few bf16 ulps per weight (of the weight
    # or of the ~0.05 it may have moved in 5 steps), unbiased (the error's mean is ~5
    # standard errors below 5e-4), and as large as with one piece's stream.
    chunked_error = chunked.float() - master
    whole_error = whole.float() - master
    ulp = torch.finfo(torch.bfloat16).eps * (master.abs() + 0.05)
    assert (chunked_error.abs() <= 8 * ulp).all()
    assert abs(float(chunked_error.mean())) < 5e-4
    chunked_rms, whole_rms = chunked_error.pow(2).mean().sqrt(), whole_error.pow(2).mean().sqrt()
    assert 0.8 < float(chunked_rms / whole_rms) < 1.25


def test_chunked_bf16_resumes_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    param, optimizer = _galore_run(monkeypatch, SMALL_BUDGET, "adamw8bit", torch.bfloat16)
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    copy = torch.nn.Parameter(param.clone())
    resumed = GaLore([copy], **{k: v for k, v in optimizer.param_groups[0].items()
                                if k != "params"})
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    original = optimizer.param_groups[0]["params"][0]
    for grad in _gradients(SHAPE, 3):
        for target, target_optimizer in ((original, optimizer), (copy, resumed)):
            target.grad = grad.to(torch.bfloat16)
            target_optimizer.step()
    assert torch.equal(original, copy)


@pytest.mark.parametrize("shape", [(40, 3, 4, 4), (24, 200)], ids=["conv", "wide"])
def test_chunked_adafactor_on_other_shapes(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...]
) -> None:
    chunked, _ = _galore_run(monkeypatch, 500, "adafactor", torch.float32, shape=shape)
    assert len(row_chunks(torch.Size(shape))) >= 4
    whole, _ = _galore_run(monkeypatch, ONE_PIECE, "adafactor", torch.float32, shape=shape)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(30, 100), (100, 30)], ids=["wide", "tall"])
def test_projected_update_chunks_both_orientations(
    monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...]
) -> None:
    chunked, _ = _galore_run(monkeypatch, 700, "adamw", torch.float32, shape=shape,
                             project=True)
    assert len(row_chunks(torch.Size(shape))) >= 4
    whole, _ = _galore_run(monkeypatch, ONE_PIECE, "adamw", torch.float32, shape=shape,
                           project=True)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)


def test_adamw_chunked_equals_one_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    results = []
    for budget in (SMALL_BUDGET, ONE_PIECE):
        monkeypatch.setattr(inner_module, "CHUNK_ELEMENTS", budget)
        param = torch.nn.Parameter(_initial(SHAPE, torch.float32))
        optimizer = AdamW([param], lr=1e-2, weight_decay=0.1)
        for grad in _gradients(SHAPE, STEPS):
            param.grad = grad
            optimizer.step()
        results.append((param.detach(), _state_tensors(optimizer)))
    (chunked, chunked_state), (whole, whole_state) = results
    assert torch.equal(chunked, whole)
    for key, value in whole_state.items():
        assert torch.equal(chunked_state[key], value), key


def test_directions_by_rows_are_chunks_of_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    grad = _gradients(SHAPE, 1)[0]
    monkeypatch.setattr(inner_module, "CHUNK_ELEMENTS", SMALL_BUDGET)
    pieces = list(inner_directions_by_rows({}, grad, "adafactor", (0.9, 0.999), 1e-8))
    monkeypatch.setattr(inner_module, "CHUNK_ELEMENTS", ONE_PIECE)
    ((rows, whole),) = inner_directions_by_rows({}, grad, "adafactor", (0.9, 0.999), 1e-8)
    assert rows is ... and len(pieces) == 4
    torch.testing.assert_close(torch.cat([piece for _, piece in pieces]), whole)


# Chunk-sized fp32 temporaries alive at once: the direction with the widened weight, then
# the widened weight with its rounding noise; 8-bit moments: two decoded moments while one
# is encoded (a padded fp32 copy, int32 and uint8 codes).
@pytest.mark.parametrize(("inner", "chunks_alive"), [
    ("adamw", 2), ("adamw8bit", 4.5), ("adafactor", 2.25)])
def test_chunked_update_keeps_temporaries_chunk_sized(
    monkeypatch: pytest.MonkeyPatch, inner: str, chunks_alive: float
) -> None:
    """The point of chunking: a bf16 parameter's update never holds full-size fp32 copies."""
    shape, budget = (512, 256), 8192  # 16 chunks of 32 KiB of fp32
    peaks = {}
    for label, chunk_elements in (("chunked", budget), ("one piece", ONE_PIECE)):
        monkeypatch.setattr(inner_module, "CHUNK_ELEMENTS", chunk_elements)
        module = torch.nn.Linear(shape[1], shape[0], bias=False).to(torch.bfloat16)
        optimizer = GaLore(module.parameters(), lr=1e-2, inner=inner, project=False)
        tracker = TensorTracker()
        tracker.attach(module, optimizer)
        for grad in _gradients(shape, 2):  # the second step: state exists already
            module.weight.grad = grad.to(torch.bfloat16)
            tracker.scan()  # count the gradient before the peak window starts
            with tracker:
                tracker.reset_peak()
                optimizer.step()
        peaks[label] = tracker.peak_by_category()["temporaries"]
    assert peaks["one piece"] >= 2 * 4 * math.prod(shape)
    assert peaks["chunked"] <= chunks_alive * 4 * budget
