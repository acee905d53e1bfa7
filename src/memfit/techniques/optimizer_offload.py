"""Optimizer state in host memory: the device keeps only parameters and gradients.

``HostOffloadOptimizer`` wraps any optimizer that has not stepped yet (its state is
created lazily, so it is created on the host). Each step copies the gradients to host
buffers (pinned on CUDA, so the copies are asynchronous), runs the inner optimizer on fp32
host copies of the parameters, and copies the updated values back. Gradient accumulation
works unchanged because nothing moves before ``step()``.

Why our own and not ``torchao.optim.CPUOffloadOptimizer``: torchao's is not a
``torch.optim.Optimizer`` (schedulers, checkpoints and the memory meter expect one), it
needs CUDA streams (it cannot run on a CPU-only machine, where our tests run), and its
gradient offload is incompatible with gradient accumulation.

On a CPU device the copies are made all the same, into storages tagged as host memory
(``accounting.mark_host``; the state and scratch of the inner step are allocated inside
``accounting.host_allocations``), so the CPU tracker counts them in its host pool and the
device shows the weights and gradients only: the saving is measured, as on CUDA.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from torch import nn
from torch.optim import Optimizer

from memfit.accounting import host_allocations, mark_host, optimizer_state_tensors


class HostOffloadOptimizer(Optimizer):
    """An Optimizer whose state and parameter master copies live in host memory."""

    def __init__(self, inner: Optimizer):
        if inner.state:
            raise ValueError("wrap the optimizer before its first step")
        self.inner = inner
        # (device parameter, its fp32 host master copy).
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for group in inner.param_groups:
            host_params = []
            for parameter in group["params"]:
                host = self._host_copy(parameter)
                self.pairs.append((parameter, host))
                host_params.append(host)
            group["params"] = host_params
        # The groups are the inner optimizer's own dicts, so an LR scheduler changing
        # self.param_groups[i]["lr"] changes what the inner optimizer uses.
        super().__init__(inner.param_groups, inner.defaults)
        self.state = inner.state

    @staticmethod
    def _host_copy(parameter: torch.Tensor) -> torch.Tensor:
        pin = parameter.is_cuda  # pinned, so the copies to and from a GPU are asynchronous
        with host_allocations():
            host = torch.empty(parameter.shape, dtype=torch.float32, pin_memory=pin)
            host.copy_(parameter.detach())
            host = nn.Parameter(host)
            # The gradient buffer is allocated once and reused every step.
            host.grad = torch.empty(parameter.shape, dtype=torch.float32, pin_memory=pin)
        mark_host((host, host.grad))
        return host

    def _mark_state_host(self) -> None:
        # State created by a step the tracker did not watch, or loaded from a checkpoint,
        # must still count as host memory when a tracker first meets it.
        mark_host(value for state in self.inner.state.values() for value in state.values()
                  if isinstance(value, torch.Tensor))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:
        if closure is not None:
            raise ValueError("HostOffloadOptimizer.step does not take a closure")
        skipped = []
        for device, host in self.pairs:
            if device.grad is None:
                skipped.append((host, host.grad))
                host.grad = None  # no gradient this step: the inner optimizer skips it
            else:
                host.grad.copy_(device.grad, non_blocking=True)
        if torch.cuda.is_available():
            torch.cuda.current_stream().synchronize()  # gradients have reached the host
        with host_allocations():  # its state and scratch are host memory
            self.inner.step()
        self._mark_state_host()
        for host, buffer in skipped:
            host.grad = buffer
        for device, host in self.pairs:
            device.copy_(host, non_blocking=True)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for device, _ in self.pairs:
            if set_to_none:
                device.grad = None
            elif device.grad is not None:
                device.grad.zero_()

    def projected_gradients(self) -> list[torch.Tensor]:
        """The inner optimizer's gradients projected in backward (GaLore's R = P^T G), which
        a training step clips with the .grad ones; none for an optimizer without them."""
        return getattr(self.inner, "projected_gradients", list)()

    def load_state_dict(self, state_dict: dict) -> None:
        self.inner.load_state_dict(state_dict)
        # Optimizer.load_state_dict rebinds these on the inner optimizer; follow it.
        self.param_groups, self.state = self.inner.param_groups, self.inner.state
        self._mark_state_host()
        # Resume loads the parameters before the optimizer: refresh the masters from them.
        for device, host in self.pairs:
            host.data.copy_(device.detach())

    def host_bytes(self) -> int:
        """Host memory this optimizer holds: master copies, gradient buffers, state."""
        seen: set[int] = set()
        total = 0
        tensors = [t for _, host in self.pairs for t in (host, host.grad)
                   if t is not None]
        tensors += [value for state in self.inner.state.values() for value in state.values()
                    if isinstance(value, torch.Tensor)]
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total


def step_on_host(optimizer: Optimizer) -> Optimizer:
    """``optimizer``, whose parameters already live in host memory (FSDP2's CPUOffloadPolicy
    shards, distributed/host_offload.py), stepping inside ``host_allocations``: its state and
    scratch are host memory too, for the CPU tracker as on CUDA. The same object (FSDP2's
    sharded checkpoints read and write it as it is), its ``step`` rebound on the instance
    (as a bound method: LR schedulers wrap ``step.__func__``)."""
    step = optimizer.step

    def step_in_host_memory(self: Optimizer, *args, **kwargs):  # noqa: ANN002, ANN003
        with host_allocations():
            result = step(*args, **kwargs)
        mark_host(optimizer_state_tensors(self))  # state a later tracker meets
        return result

    optimizer.step = types.MethodType(step_in_host_memory, optimizer)
    return optimizer
