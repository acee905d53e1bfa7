"""One optimizer step (memfit.training.step) against the same step written plainly in
torch: accumulation, clipping, a skipped update, per-layer hooks, an OOM in the update."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memfit.config.schema import Precision
from memfit.monitor.memory import CpuMemoryMeter
from memfit.training.nonfinite import Verdict
from memfit.training.step import OptimizerStepOutOfMemory, StepParts, optimizer_step

MAX_GRAD_NORM = 0.1  # well below the norm of these gradients: clipping changes the update


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _loss_sum(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.mse_loss(model(batch["x"]), batch["y"], reduction="sum")


def _micro_batches(count: int = 2) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [{"x": torch.randn(4, 8, generator=generator),    # [examples, features]
             "y": torch.randn(4, 1, generator=generator)} for _ in range(count)]


def _parts(model: nn.Module, optimizer: torch.optim.Optimizer) -> StepParts:
    return StepParts(model, optimizer, _loss_sum, Precision.FP32, torch.device("cpu"),
                     measure_grad_norm=True, max_grad_norm=MAX_GRAD_NORM)


def _plain_step(model: nn.Module, optimizer: torch.optim.Optimizer,
                micro_batches: list[dict[str, torch.Tensor]]) -> tuple[float, float]:
    """The oracle: the mean over all micro-batches' examples, clipped, one update."""
    items = sum(len(batch["x"]) for batch in micro_batches)
    loss = 0.0
    for batch in micro_batches:
        mean_part = _loss_sum(model, batch) / items
        mean_part.backward()
        loss += mean_part.item()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, float(norm)


def _adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


def test_a_step_with_accumulation_and_clipping_equals_the_plain_torch_step():
    ours, theirs = _model(), _model()
    ours_optimizer, theirs_optimizer = _adamw(ours), _adamw(theirs)
    for _ in range(2):  # the second step uses the optimizer state of the first
        outcome = optimizer_step(_parts(ours, ours_optimizer), _micro_batches(), items=8)
        loss, norm = _plain_step(theirs, theirs_optimizer, _micro_batches())
        assert outcome.loss == pytest.approx(loss, rel=1e-6)
        assert outcome.grad_norm == pytest.approx(norm, rel=1e-6)
        assert norm > MAX_GRAD_NORM
        assert outcome.verdict is Verdict.APPLY
    for mine, reference in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(mine, reference)
        assert mine.grad is None


def test_a_skip_verdict_leaves_weights_and_optimizer_state_unchanged():
    model = _model()
    optimizer = _adamw(model)
    optimizer_step(_parts(model, optimizer), _micro_batches(), items=8)  # state exists now
    weights = copy.deepcopy(model.state_dict())
    state = copy.deepcopy(optimizer.state_dict())
    seen = []

    def skip(loss: float, grad_norm: float | None) -> Verdict:
        seen.append((loss, grad_norm))
        return Verdict.SKIP

    outcome = optimizer_step(_parts(model, optimizer), _micro_batches(), items=8, judge=skip)
    assert outcome.verdict is Verdict.SKIP
    assert seen == [(outcome.loss, outcome.grad_norm)]
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, weights[name], rtol=0, atol=0)
    after = optimizer.state_dict()["state"]
    for index, values in state["state"].items():
        for key, value in values.items():
            torch.testing.assert_close(after[index][key], value, rtol=0, atol=0)
    assert all(p.grad is None for p in model.parameters())  # the dropped gradients too


def test_per_layer_hooks_without_an_optimizer_and_an_undivided_mean_loss():
    """A bench peer's per-layer optimizers: stepped by hooks in backward; the step only
    runs forward and backward of the mean loss (items=None), as a plain loop would."""
    ours, theirs = _model(), _model()
    for parameter in ours.parameters():
        inner = torch.optim.SGD([parameter], lr=0.1)

        def step(_: torch.Tensor, inner: torch.optim.Optimizer = inner) -> None:
            inner.step()
            inner.zero_grad(set_to_none=True)

        parameter.register_post_accumulate_grad_hook(step)
    batch = _micro_batches(1)[0]

    def mean_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.mse_loss(model(batch["x"]), batch["y"])

    outcome = optimizer_step(StepParts(ours, None, mean_loss, Precision.FP32,
                                       torch.device("cpu")), [batch], items=None)
    plain = torch.optim.SGD(theirs.parameters(), lr=0.1)
    loss = mean_loss(theirs, batch)
    loss.backward()
    plain.step()
    assert outcome.loss == loss.item()
    assert outcome.grad_norm is None  # not measured, as the plain loop does not
    for mine, reference in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(mine, reference)


def test_out_of_memory_in_the_update_is_told_apart_from_one_in_backward():
    """Backward fits the simulated budget, AdamW's first step (2 state tensors per weight)
    does not; the loop must not retry such a step (some state may have changed)."""
    model = nn.Linear(256, 256, bias=False)  # 256 KiB of weights, 256 KiB of gradients
    optimizer = _adamw(model)
    meter = CpuMemoryMeter(budget_bytes=640 * 1024)
    meter.attach(model, optimizer)
    batch = {"x": torch.randn(4, 256), "y": torch.randn(4, 256)}
    with pytest.raises(OptimizerStepOutOfMemory) as raised, meter.step():
        optimizer_step(_parts(model, optimizer), [batch], items=4)
    assert isinstance(raised.value, torch.OutOfMemoryError)  # what bench cases catch
