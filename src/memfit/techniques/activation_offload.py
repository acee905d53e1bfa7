"""Activation offload: tensors saved for backward live in host memory until backward needs
them, and the host bytes they occupy are counted.

Our own ``saved_tensors_hooks`` pair rather than ``torch.autograd.graph.save_on_cpu``:
the same copy (pinned on CUDA so the copy back can overlap), plus a live/peak count of
the host bytes for ``metrics.jsonl``.

On a CPU device the host is the same memory as the device, but the offload still happens:
each saved tensor is copied into a fresh storage tagged as host memory
(``accounting.host_allocations``), which the CPU tracker counts in its host pool, and
backward gets a new device copy back -- so the device's activation bytes fall by what the
plan says, and the saving is measured, not assumed. With gradient checkpointing on, what
reaches these hooks are the checkpointed blocks' inputs (the blocks' own saved tensors go
to checkpoint's inner hooks, which keep nothing).
"""

from __future__ import annotations

import contextlib
import weakref

import torch

from memfit.accounting import host_allocations, mark_host


class ActivationOffload:
    def __init__(self, device: torch.device):
        self.device = device
        self.live_host_bytes = 0
        self.peak_host_bytes = 0  # since the last reset_peak()

    def context(self, enabled: bool) -> contextlib.AbstractContextManager:
        """Wrap a forward pass."""
        if not enabled:
            return contextlib.nullcontext()
        if self.device.type == "cpu":
            return torch.autograd.graph.saved_tensors_hooks(self._pack_on_cpu, _new_copy)
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def reset_peak(self) -> None:
        self.peak_host_bytes = self.live_host_bytes

    def _pack(self, tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
        if tensor.device.type == "cpu":
            return tensor.device, tensor
        host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout,
                           pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        self._count(host)
        return tensor.device, host

    def _pack_on_cpu(self, tensor: torch.Tensor) -> torch.Tensor:
        # Autograd packs with grad mode off: the copy records no graph of its own.
        with host_allocations():
            host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout)
            host.copy_(tensor)
        mark_host((host,))  # stays host if a later tracker meets it (a step not measured)
        self._count(host)
        return host

    def _count(self, host: torch.Tensor) -> None:
        self.live_host_bytes += host.nbytes
        self.peak_host_bytes = max(self.peak_host_bytes, self.live_host_bytes)
        # The host copy dies when autograd drops it (after backward used it).
        weakref.finalize(host, self._release, host.nbytes)

    def _release(self, nbytes: int) -> None:
        self.live_host_bytes -= nbytes

    @staticmethod
    def _unpack(packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
        device, tensor = packed
        return tensor.to(device, non_blocking=True)


def _new_copy(host: torch.Tensor) -> torch.Tensor:
    """Backward's device tensor: a new copy (``.to("cpu")`` would hand back the host one)."""
    return host.clone()
