"""Activation offload: tensors saved for backward live in host memory until backward needs
them, and the host bytes they occupy are counted.

Our own ``saved_tensors_hooks`` pair rather than ``torch.autograd.graph.save_on_cpu``:
the same copy (pinned on CUDA so the copy back can overlap), plus a live/peak count of
the host bytes for ``metrics.jsonl``. On a CPU device the host *is* the device: tensors
are kept as they are and nothing is counted.
"""

from __future__ import annotations

import contextlib
import weakref

import torch


class ActivationOffload:
    def __init__(self, device: torch.device):
        self.device = device
        self.live_host_bytes = 0
        self.peak_host_bytes = 0  # since the last reset_peak()

    def context(self, enabled: bool) -> contextlib.AbstractContextManager:
        """Wrap a forward pass."""
        if not enabled or self.device.type == "cpu":
            return contextlib.nullcontext()
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def reset_peak(self) -> None:
        self.peak_host_bytes = self.live_host_bytes

    def _pack(self, tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
        if tensor.device.type == "cpu":
            return tensor.device, tensor
        host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout,
                           pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        self.live_host_bytes += host.nbytes
        self.peak_host_bytes = max(self.peak_host_bytes, self.live_host_bytes)
        # The host copy dies when autograd drops it (after backward used it).
        weakref.finalize(host, self._release, host.nbytes)
        return tensor.device, host

    def _release(self, nbytes: int) -> None:
        self.live_host_bytes -= nbytes

    @staticmethod
    def _unpack(packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
        device, tensor = packed
        return tensor.to(device, non_blocking=True)
