"""Activation offload on a CPU device: every saved tensor really copied into host-tagged
storage, so the tracker's device peak falls by those bytes and its host pool holds them;
gradients equal to training without offload (with and without checkpointing)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from memfit.monitor.memory import CpuMemoryMeter
from memfit.techniques.activation_offload import ActivationOffload

BATCH, WIDTH = 64, 32


def blocks() -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(3))


def loss_of(model: nn.ModuleList, batch: torch.Tensor, checkpointed: bool) -> torch.Tensor:
    hidden = batch
    for block in model:
        hidden = checkpoint(block, hidden, use_reentrant=False) if checkpointed else block(hidden)
    return hidden.pow(2).mean()


def saved_bytes(model: nn.ModuleList, batch: torch.Tensor, checkpointed: bool) -> int:
    """The oracle: bytes of every tensor autograd saves in this forward (what offload copies:
    a contiguous tensor of the same size each), counted by a plain pair of hooks."""
    sizes = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        sizes.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss_of(model, batch, checkpointed)
    return sum(sizes)


def measured_step(checkpointed: bool, offload: bool):
    model = blocks()
    batch = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(1))
    offloader = ActivationOffload(torch.device("cpu"))
    meter = CpuMemoryMeter()
    meter.attach(model)
    with meter.step():
        with offloader.context(enabled=offload):
            loss = loss_of(model, batch, checkpointed)
        loss.backward()
    grads = [p.grad for p in model.parameters()]
    return meter.last_step, offloader, grads, saved_bytes(model, batch, checkpointed)


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointing"])
def test_saved_tensors_leave_the_device_for_the_host_pool(checkpointed):
    plain, _, want, saved = measured_step(checkpointed, offload=False)
    offloaded, offloader, got, _ = measured_step(checkpointed, offload=True)
    for grad, expected in zip(got, want, strict=True):
        torch.testing.assert_close(grad, expected, rtol=0, atol=0)
    # Every saved tensor's copy is alive at the end of forward: the host pool's peak is
    # exactly their bytes, the offloader counts the same, and none of it is device memory.
    assert offloaded.host_peak_bytes == offloader.peak_host_bytes == saved > 0
    assert plain.host_peak_bytes == 0
    assert offloader.live_host_bytes == 0  # backward released every copy
    assert sum(offloaded.by_category.values()) == offloaded.peak_bytes
    assert offloaded.peak_bytes < plain.peak_bytes
