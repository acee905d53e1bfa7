"""Learning-rate schedules: linear warmup from 0, then constant, linear or cosine to 0."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from memfit.config.schema import LrSchedule


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: LrSchedule) -> float:
    """Multiplier of the peak lr for the update made at optimizer step ``step + 1``."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule is LrSchedule.CONSTANT:
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    progress = min(progress, 1.0)
    if schedule is LrSchedule.LINEAR:
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: Optimizer, total_steps: int, warmup_steps: int,
                    schedule: LrSchedule) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, warmup_steps, schedule))
