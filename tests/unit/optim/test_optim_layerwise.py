"""LayerwiseOptimizer against the ordinary loop (backward per micro-batch, then step)."""

from __future__ import annotations

import io
import math

import pytest
import torch

from memfit._utils.errors import ConfigError
from memfit.optim import GaLore, LayerwiseOptimizer

MICRO_BATCHES = 3


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.Tanh(), torch.nn.Linear(12, 6))


def _data(steps: int, seed: int = 0) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        [
            (torch.randn(4, 8, generator=generator), torch.randn(4, 6, generator=generator))
            for _ in range(MICRO_BATCHES)
        ]
        for _ in range(steps)
    ]


def _loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return ((model(inputs) - targets) ** 2).mean() / MICRO_BATCHES


def _ordinary_loop(model, optimizer, data, max_grad_norm: float | None = None) -> list[float]:
    norms = []
    for micro_batches in data:
        for batch in micro_batches:
            _loss(model, batch).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)))
        if max_grad_norm is not None:  # the oracle for per-tensor clipping
            for param in model.parameters():
                torch.nn.utils.clip_grad_norm_([param], max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
    return norms


def _layerwise_loop(model, optimizer: LayerwiseOptimizer, data) -> list[float]:
    norms = []
    for micro_batches in data:
        for index, batch in enumerate(micro_batches):
            optimizer.begin_micro_batch(index)
            _loss(model, batch).backward()
            assert all(p.grad is None for p in model.parameters())
        optimizer.step()
        optimizer.zero_grad()
        norms.append(optimizer.grad_norm)
    return norms


def _assert_same_parameters(first: torch.nn.Module, second: torch.nn.Module) -> None:
    for a, b in zip(first.parameters(), second.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_adamw_with_accumulation_and_clipping_equals_ordinary_loop() -> None:
    data = _data(4)
    ordinary, layerwise = _model(), _model()
    norms = _ordinary_loop(ordinary, torch.optim.AdamW(ordinary.parameters(), lr=1e-2), data, 0.3)
    optimizer = LayerwiseOptimizer(
        layerwise.parameters(),
        make_optimizer=lambda groups: torch.optim.AdamW(groups, lr=1e-2),
        gradient_accumulation_steps=MICRO_BATCHES,
        max_grad_norm=0.3,
    )
    layerwise_norms = _layerwise_loop(layerwise, optimizer, data)
    _assert_same_parameters(ordinary, layerwise)
    assert layerwise_norms == pytest.approx(norms, rel=1e-5)  # true pre-clip global norms
    assert max(norms) > 0.3  # clipping was active
    assert optimizer.accumulation_buffer_bytes() == 4 * sum(
        p.numel() for p in layerwise.parameters()
    )


def test_galore_full_gradient_refresh_equals_ordinary_loop() -> None:
    data = _data(5)
    options = dict(lr=1e-2, rank=3, update_gap=2, seed=3)
    ordinary, layerwise = _model(), _model()
    _ordinary_loop(ordinary, GaLore(ordinary.parameters(), **options), data)
    optimizer = LayerwiseOptimizer(
        layerwise.parameters(),
        make_optimizer=lambda groups: GaLore(groups, **options),
        gradient_accumulation_steps=MICRO_BATCHES,
        projector_refresh="full_gradient",
    )
    _layerwise_loop(layerwise, optimizer, data)
    _assert_same_parameters(ordinary, layerwise)


def test_galore_micro_batch_refresh_accumulates_projected_gradient() -> None:
    """Oracle: P from micro-batch 0's gradient on refresh steps, projected Adam on the sum."""
    torch.manual_seed(0)
    rank, lr, scale, update_gap = 2, 1e-2, 0.25, 2
    layer = torch.nn.Linear(8, 6, bias=False)  # weight 6 x 8: P (6 x 2) on the left
    oracle = layer.weight.detach().clone()
    optimizer = LayerwiseOptimizer(
        layer.parameters(),
        make_optimizer=lambda groups: GaLore(groups, lr=lr, rank=rank, update_gap=update_gap,
                                             subspace_change="keep"),  # as the oracle
        gradient_accumulation_steps=MICRO_BATCHES,
    )
    assert optimizer.accumulation_buffer_bytes() == 4 * rank * 8  # r x n fp32, not m x n
    first_moment = second_moment = torch.zeros(rank, 8)
    basis = None
    for step, micro_batches in enumerate(_data(5), start=1):
        grads = []
        for index, (inputs, targets) in enumerate(micro_batches):
            optimizer.begin_micro_batch(index)
            ((layer(inputs) - targets) ** 2).mean().backward()
            weight = oracle.clone().requires_grad_()
            ((inputs @ weight.T - targets) ** 2).mean().backward()
            grads.append(weight.grad)
        optimizer.step()
        if (step - 1) % update_gap == 0:
            new = torch.linalg.svd(grads[0], full_matrices=False)[0][:, :rank]
            if basis is not None:  # each new singular vector keeps the old one's sign
                new = new * torch.where((new * basis).sum(dim=0) < 0, -1.0, 1.0)
            basis = new
        projected = basis.T @ sum(grads)
        first_moment = 0.9 * first_moment + 0.1 * projected
        second_moment = 0.999 * second_moment + 0.001 * projected**2
        adam = (first_moment / (1 - 0.9**step)) / (
            (second_moment / (1 - 0.999**step)).sqrt() + 1e-8
        )
        oracle = oracle - lr * scale * basis @ adam
        torch.testing.assert_close(layer.weight.detach(), oracle, rtol=1e-5, atol=1e-6)


class _DoublingReduction:
    """What an all-reduce over 2 processes holding the same gradient does (x2), applied
    only when waited on — as an asynchronous one completes — so an update that did not
    wait for its reduction would see the un-summed gradient."""

    def __init__(self, tensor: torch.Tensor, started: list[torch.Tensor]):
        self.tensor = tensor
        started.append(tensor)

    def wait(self) -> None:
        self.tensor.mul_(2)


@pytest.mark.parametrize("make_optimizer", [
    lambda groups: torch.optim.SGD(groups, lr=1e-2),
    lambda groups: GaLore(groups, lr=1e-2, rank=3, update_gap=2, seed=3),
], ids=["sgd", "galore"])
def test_reduced_across_processes_equals_the_summed_loss(make_optimizer) -> None:
    """Oracle: 2 identical processes sum the gradients, which is the gradient of twice the
    loss (x2 is exact in floating point, so the results are bitwise equal). GaLore's
    micro_batch refresh takes P from the summed first gradient, then sums the R buffers."""
    data = _data(4)
    reduced, reference = _model(), _model()
    started: list[torch.Tensor] = []
    optimizer = LayerwiseOptimizer(reduced.parameters(), make_optimizer=make_optimizer,
                                   gradient_accumulation_steps=MICRO_BATCHES,
                                   max_grad_norm=0.5)
    optimizer.reduce_across_processes(lambda tensor: _DoublingReduction(tensor, started))
    twice = LayerwiseOptimizer(reference.parameters(), make_optimizer=make_optimizer,
                               gradient_accumulation_steps=MICRO_BATCHES, max_grad_norm=0.5)
    for micro_batches in data:
        for index, batch in enumerate(micro_batches):
            optimizer.begin_micro_batch(index)
            _loss(reduced, batch).backward()
            twice.begin_micro_batch(index)
            (2 * _loss(reference, batch)).backward()
        optimizer.step()
        twice.step()
        assert optimizer.grad_norm == twice.grad_norm
    for a, b in zip(reduced.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)
    # One reduction per parameter and step, plus GaLore's refresh copies (steps 1 and 3).
    expected = 4 * len(data) + (2 * 2 if isinstance(optimizer.inner_optimizers[0], GaLore)
                                else 0)
    assert len(started) == expected


def test_scheduler_reaches_inner_optimizers() -> None:
    model = _model()
    optimizer = LayerwiseOptimizer(
        model.parameters(), make_optimizer=lambda groups: GaLore(groups, lr=0.1, rank=2)
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    for _ in range(3):
        _loss(model, (torch.randn(4, 8), torch.randn(4, 6))).backward()
        optimizer.step()
        scheduler.step()
    _loss(model, (torch.randn(4, 8), torch.randn(4, 6))).backward()  # steps with lr 0.1 / 8
    for inner in optimizer.inner_optimizers:
        assert inner.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
    seeds = [inner.param_groups[0]["seed"] for inner in optimizer.inner_optimizers]
    assert seeds == list(range(4))  # parameter k's stream equals one optimizer's position k


def test_resume_equals_uninterrupted() -> None:
    data = _data(6, seed=1)

    def build(model: torch.nn.Module) -> LayerwiseOptimizer:
        return LayerwiseOptimizer(
            model.parameters(),
            make_optimizer=lambda groups: GaLore(groups, lr=1e-2, rank=3, update_gap=2),
            gradient_accumulation_steps=MICRO_BATCHES,
        )

    model = _model()
    optimizer = build(model)
    _layerwise_loop(model, optimizer, data[:3])
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed_model = _model()
    resumed_model.load_state_dict(saved["model"])
    resumed = build(resumed_model)
    resumed.load_state_dict(saved["optimizer"])
    _layerwise_loop(model, optimizer, data[3:])
    _layerwise_loop(resumed_model, resumed, data[3:])
    for a, b in zip(model.parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_misuse_is_reported() -> None:
    model = _model()
    optimizer = LayerwiseOptimizer(
        model.parameters(),
        make_optimizer=lambda groups: torch.optim.SGD(groups, lr=0.1),
        gradient_accumulation_steps=2,
    )
    with pytest.raises(RuntimeError, match="begin_micro_batch"):
        _loss(model, (torch.randn(4, 8), torch.randn(4, 6))).backward()
    optimizer.begin_micro_batch(0)
    _loss(model, (torch.randn(4, 8), torch.randn(4, 6))).backward()
    with pytest.raises(RuntimeError, match="still accumulating"):
        optimizer.step()
    with pytest.raises(ValueError, match="outside 0..1"):
        optimizer.begin_micro_batch(2)


@pytest.mark.parametrize(
    "options,message",
    [
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps=0"),
        ({"max_grad_norm": -1.0}, "max_grad_norm=-1.0"),
        ({"projector_refresh": "never"}, "micro_batch, full_gradient"),
    ],
)
def test_bad_arguments_raise_config_error(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LayerwiseOptimizer(
            _model().parameters(), lambda groups: torch.optim.SGD(groups, lr=0.1), **options
        )
