"""HostOffloadOptimizer: the inner optimizer's trajectory unchanged, an Optimizer that LR
schedulers and weights_only checkpoints work with, and its host bytes reported exactly."""

from __future__ import annotations

import io

import pytest
import torch

from memfit.techniques.optimizer_offload import HostOffloadOptimizer


def train(model, optimizer, steps=4, scheduler=None):
    torch.manual_seed(1)
    for _ in range(steps):
        loss = model(torch.randn(8, 6)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()


def model_and_copy():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    copy = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    copy.load_state_dict(model.state_dict())
    return model, copy


def test_same_trajectory_as_the_inner_optimizer_with_a_scheduler():
    model, reference = model_and_copy()
    offloaded = HostOffloadOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    train(model, offloaded, scheduler=torch.optim.lr_scheduler.StepLR(offloaded, 1, 0.5))
    train(reference, plain, scheduler=torch.optim.lr_scheduler.StepLR(plain, 1, 0.5))
    assert offloaded.param_groups[0]["lr"] == plain.param_groups[0]["lr"] == 1e-2 / 16
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_state_dict_round_trip_with_weights_only_and_host_bytes():
    model, reference = model_and_copy()
    offloaded = HostOffloadOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    train(model, offloaded, steps=2)
    buffer = io.BytesIO()
    torch.save(offloaded.state_dict(), buffer)
    buffer.seek(0)
    reference.load_state_dict(model.state_dict())
    restored = HostOffloadOptimizer(torch.optim.AdamW(reference.parameters(), lr=1e-2))
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    train(model, offloaded, steps=2)
    train(reference, restored, steps=2)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # On a CPU-only machine the host is the device: only AdamW's two fp32 moments per
    # parameter (+ a 4-byte step counter each) live there.
    weights = sum(p.nbytes for p in model.parameters())
    steps = 4 * len(list(model.parameters()))
    assert offloaded.host_bytes() == 2 * weights + steps


def test_wrapping_after_a_step_is_refused():
    model, _ = model_and_copy()
    inner = torch.optim.AdamW(model.parameters())
    train(model, inner, steps=1)
    with pytest.raises(ValueError, match="before its first step"):
        HostOffloadOptimizer(inner)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_state_lives_on_the_host():
    model, reference = model_and_copy()
    model.cuda()
    offloaded = HostOffloadOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    train(model, offloaded)
    train(reference, plain)
    assert all(v.device.type == "cpu" for s in offloaded.state.values() for v in s.values())
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.cpu(), want)
