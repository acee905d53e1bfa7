"""GaLore's projected gradient taken from linear layers' backward equals projecting the
full gradient: per layer against P^T G computed by hand, and over training (refreshes and
gradient accumulation included) against GaLore fed ordinary gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from memfit.optim import GaLore, LayerwiseOptimizer
from memfit.optim.backward_projection import clip_grad_norm_, project_in_backward


class _FixedBasis:
    """A sink that projects every gradient with one fixed basis and records what arrives."""

    def __init__(self, basis: torch.Tensor) -> None:
        self.basis = basis
        self.received: list[torch.Tensor] = []

    def backward_projection_basis(self, param: torch.Tensor) -> torch.Tensor:
        return self.basis

    def add_projected_gradient(self, param: torch.Tensor, projected: torch.Tensor) -> None:
        self.received.append(projected)


@pytest.mark.parametrize(("in_features", "out_features"), [(12, 5), (5, 12), (7, 7)])
def test_projected_gradient_equals_projecting_the_weight_gradient(in_features, out_features):
    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features)
    x = torch.randn(3, 4, in_features, requires_grad=True)  # batch x sequence x in
    upstream = torch.randn(3, 4, out_features)

    (layer(x) * upstream).sum().backward()
    weight_grad, bias_grad, input_grad = layer.weight.grad, layer.bias.grad, x.grad
    layer.zero_grad()
    x.grad = None

    smaller = min(in_features, out_features)
    basis = torch.linalg.qr(torch.randn(smaller, 3)).Q  # s x r
    sink = _FixedBasis(basis)
    project_in_backward(layer, sink, {id(layer.weight)})
    (layer(x) * upstream).sum().backward()

    g = weight_grad if out_features <= in_features else weight_grad.T  # s x l
    (projected,) = sink.received
    torch.testing.assert_close(projected, basis.T @ g)
    assert layer.weight.grad is None  # never formed
    torch.testing.assert_close(layer.bias.grad, bias_grad)
    torch.testing.assert_close(x.grad, input_grad)


def test_routing_again_replaces_the_earlier_route():
    layer = nn.Linear(4, 3)
    sink = _FixedBasis(torch.eye(3)[:, :2])
    assert project_in_backward(layer, sink, {id(layer.weight)}) == [""]
    assert project_in_backward(layer, sink, set()) == []
    layer(torch.randn(2, 4)).sum().backward()
    assert layer.weight.grad is not None and not sink.received
    assert "forward" not in vars(layer)  # the class's forward again


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    # Wide (8 -> 20: out > in, so P comes from G^T), square-ish and narrow layers.
    return nn.Sequential(nn.Linear(8, 20), nn.GELU(), nn.Linear(20, 16, bias=False), nn.GELU(),
                         nn.Linear(16, 6))


def _train(model: nn.Module, in_backward: bool, steps: int = 7, micro_batches: int = 2,
           max_norm: float | None = None, dtype: torch.dtype = torch.float32):
    model = copy.deepcopy(model).to(dtype)
    optimizer = GaLore(model.parameters(), lr=1e-2, rank=4, update_gap=3, scale=1.0,
                       projector="randomized_svd", weight_decay=0.1)
    if in_backward:
        linears = {id(m.weight) for m in model if isinstance(m, nn.Linear)}
        project_in_backward(model, optimizer, linears)
    generator = torch.Generator().manual_seed(1)
    norms = []
    for _ in range(steps):
        for _ in range(micro_batches):
            x = torch.randn(3, 5, 8, generator=generator).to(dtype)
            model(x).float().pow(2).mean().backward()
        norms.append(float(clip_grad_norm_(list(model.parameters()), max_norm,
                                           optimizer.projected_gradients())))
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer, norms


def test_training_with_projection_in_backward_equals_full_gradients():
    # update_gap 3 over 7 steps: refreshes at steps 0, 3, 6 take the full gradient, the
    # others the projected one, each accumulated over 2 micro-batches.
    reference, _, _ = _train(_model(), in_backward=False)
    fused, optimizer, _ = _train(_model(), in_backward=True)
    for expected, actual in zip(reference.parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    assert "projected" not in str(optimizer.state_dict())  # buffers are not state


def test_clipping_counts_projected_weights_by_the_norm_of_r():
    model = _model()
    optimizer = GaLore(model.parameters(), lr=1e-2, rank=4, update_gap=100)
    project_in_backward(model, optimizer, {id(m.weight) for m in model if isinstance(m, nn.Linear)})
    for _ in range(2):  # step 0 refreshes P from the full gradient; step 1 is projected
        model(torch.randn(5, 8)).pow(2).mean().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        projected = [r.clone() for r in optimizer.projected_gradients()]
        norm = clip_grad_norm_(list(model.parameters()), 1e-3, optimizer.projected_gradients())
        optimizer.step()
        optimizer.zero_grad()
    assert len(projected) == 3 and len(grads) == 2  # three R, two biases
    expected = torch.cat([t.flatten() for t in grads + projected]).norm()
    torch.testing.assert_close(norm, expected)
    assert not optimizer.projected_gradients()  # consumed by the step


def test_zero_grad_drops_projected_gradients():
    model = _model()
    optimizer = GaLore(model.parameters(), lr=1e-2, rank=4, update_gap=100)
    project_in_backward(model, optimizer, {id(m.weight) for m in model if isinstance(m, nn.Linear)})
    for _ in range(2):
        model(torch.randn(5, 8)).pow(2).mean().backward()
        if optimizer.projected_gradients():
            break
        optimizer.step()
        optimizer.zero_grad()
    assert len(optimizer.projected_gradients()) == 3
    optimizer.zero_grad()
    assert not optimizer.projected_gradients()


def test_bf16_autocast_saves_bf16_activations_and_stays_close_to_fp32():
    layer = nn.Linear(16, 8)
    sink = _FixedBasis(torch.linalg.qr(torch.randn(8, 4)).Q)
    project_in_backward(layer, sink, {id(layer.weight)})
    x = torch.randn(6, 16)
    saved: list[torch.dtype] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t,
                                                  lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = layer(x)
    assert output.dtype == torch.bfloat16 and saved == [torch.bfloat16, torch.bfloat16]
    output.float().sum().backward()
    expected = sink.basis.T @ torch.ones(6, 8).T @ x  # P^T D^T X in fp32
    torch.testing.assert_close(sink.received[0], expected, rtol=2e-2, atol=2e-2)


def test_bf16_weights_train_like_fp32_reference():
    reference, _, _ = _train(_model(), in_backward=False)
    fused, _, _ = _train(_model(), in_backward=True, dtype=torch.bfloat16)
    for expected, actual in zip(reference.parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(actual.float(), expected, rtol=0, atol=2e-2)


def _train_layerwise(in_backward: bool, projector_refresh: str) -> nn.Module:
    model = copy.deepcopy(_model())
    optimizer = LayerwiseOptimizer(
        model.parameters(), make_optimizer=lambda groups: GaLore(
            groups, lr=1e-2, rank=4, update_gap=3, scale=1.0, projector="randomized_svd"),
        gradient_accumulation_steps=2, projector_refresh=projector_refresh)
    if in_backward:
        linears = {id(m.weight) for m in model if isinstance(m, nn.Linear)}
        project_in_backward(model, optimizer, linears)
    generator = torch.Generator().manual_seed(1)
    for _ in range(7):
        for index in range(2):
            optimizer.begin_micro_batch(index)
            model(torch.randn(3, 5, 8, generator=generator)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


@pytest.mark.parametrize("projector_refresh", ["micro_batch", "full_gradient"])
def test_layerwise_with_projection_in_backward_equals_full_gradients(projector_refresh):
    reference = _train_layerwise(False, projector_refresh)
    fused = _train_layerwise(True, projector_refresh)
    for expected, actual in zip(reference.parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
