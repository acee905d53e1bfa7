"""Activation offload: tensors saved for backward live in host memory until backward."""

from __future__ import annotations

import contextlib

import torch


def context(enabled: bool, device: torch.device) -> contextlib.AbstractContextManager:
    """Wrap a forward pass. On CUDA the host copies are pinned so the copy back overlaps."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")
