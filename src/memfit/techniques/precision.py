"""Mixed precision: an autocast context for forward passes and, for fp16, a grad scaler."""

from __future__ import annotations

import contextlib

import torch

from memfit.config.schema import Precision

AUTOCAST_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}


def autocast(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager:
    if precision not in AUTOCAST_DTYPES:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[precision])


def grad_scaler(precision: Precision, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range."""
    if precision is not Precision.FP16:
        return None
    return torch.amp.GradScaler(device.type)
