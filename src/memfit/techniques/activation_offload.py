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
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from memfit.accounting import host_allocations, mark_host

Hooks = Callable[[], contextlib.AbstractContextManager]
# The hooks the chosen blocks push while they run; None: no offload in blocks is open.
_IN_BLOCKS: ContextVar[Hooks | None] = ContextVar("memfit_offload_in_blocks", default=None)


class ActivationOffload:
    def __init__(self, device: torch.device):
        self.device = device
        self.live_host_bytes = 0
        self.peak_host_bytes = 0  # since the last reset_peak()

    def context(self, enabled: bool, in_blocks_only: bool = False
                ) -> contextlib.AbstractContextManager:
        """Wrap a forward pass; ``in_blocks_only`` (memory.offload_blocks set): offload
        inside the blocks ``offload_in_blocks`` marked, nothing outside them."""
        if not enabled:
            return contextlib.nullcontext()
        if in_blocks_only:
            return offloading_in_blocks(self.hooks)
        return self.hooks()

    def hooks(self) -> saved_tensors_hooks:
        """The saved-tensors hooks that offload (one use each)."""
        if self.device.type == "cpu":
            return saved_tensors_hooks(self._pack_on_cpu, _new_copy)
        return saved_tensors_hooks(self._pack, self._unpack)

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


@contextlib.contextmanager
def offloading_in_blocks(hooks: Hooks) -> Iterator[None]:
    """While open, each block marked by ``offload_in_blocks`` runs inside ``hooks()``."""
    token = _IN_BLOCKS.set(hooks)
    try:
        yield
    finally:
        _IN_BLOCKS.reset(token)


def offload_in_blocks(chosen: list[nn.Module]) -> None:
    """Mark ``chosen`` blocks: each pushes the open offload's hooks for its whole call."""
    for block in chosen:
        running = _WhileRunning()
        block.register_forward_pre_hook(running.enter)
        block.register_forward_hook(running.exit, always_call=True)


class _WhileRunning:
    """One block's pre-hook and hook: the hooks entered for its call, left after it (a
    stack: a block called again inside its own call, as a recursive module would, nests)."""

    def __init__(self) -> None:
        self.entered: list[contextlib.AbstractContextManager] = []

    def enter(self, module: nn.Module, args: Any) -> None:
        hooks = _IN_BLOCKS.get()
        context = hooks() if hooks is not None else contextlib.nullcontext()
        context.__enter__()
        self.entered.append(context)

    def exit(self, module: nn.Module, args: Any, output: Any) -> None:
        self.entered.pop().__exit__(None, None, None)
