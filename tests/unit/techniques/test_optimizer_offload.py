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
    # Even on a CPU device: the fp32 master copy, its gradient buffer and AdamW's two fp32
    # moments per parameter (+ a 4-byte step counter each) live in host memory.
    weights = sum(p.nbytes for p in model.parameters())
    steps = 4 * len(list(model.parameters()))
    assert offloaded.host_bytes() == 4 * weights + steps


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


def test_on_a_cpu_device_the_tracker_counts_masters_grads_and_state_as_host():
    """The device keeps the weights and their gradients only (its peak is that of forward
    and backward without any optimizer); the fp32 master copies, their gradient buffers,
    AdamW's state and its step's scratch are the tracker's host pool."""
    from memfit.monitor.memory import CpuMemoryMeter

    model, reference = model_and_copy()
    no_optimizer = CpuMemoryMeter()
    no_optimizer.attach(reference)
    with no_optimizer.step():
        torch.manual_seed(1)  # the batch train() draws
        reference(torch.randn(8, 6)).pow(2).mean().backward()
    reference.zero_grad()
    offloaded = HostOffloadOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2,
                                                       foreach=False))
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-2, foreach=False)
    meter = CpuMemoryMeter()
    meter.attach(model, offloaded)
    largest = max(p.nbytes for p in model.parameters())
    for _ in range(2):  # the first step creates the state inside the step
        with meter.step():
            train(model, offloaded, steps=1)
        memory = meter.last_step
        assert memory.by_category["optimizer"] == 0
        assert memory.peak_bytes == no_optimizer.last_step.peak_bytes
        # AdamW (foreach=False) divides by sqrt(exp_avg_sq) / bias correction: two
        # temporaries the size of the largest parameter, in the host step.
        assert memory.host_peak_bytes == offloaded.host_bytes() + 2 * largest
        assert memory.to_record()["memory_host_peak_bytes"] == memory.host_peak_bytes
    assert meter.tracker.host_live_bytes == offloaded.host_bytes()
    for _ in range(2):  # the same batches: train() draws them from seed 1 each call
        train(reference, plain, steps=1)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
