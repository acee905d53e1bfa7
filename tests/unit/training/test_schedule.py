import math

import pytest
import torch

from memfit.config.schema import LrSchedule
from memfit.training.schedule import build_scheduler, lr_factor


def test_warmup_rises_linearly_then_cosine_falls_to_zero():
    factors = [lr_factor(step, 10, 2, LrSchedule.COSINE) for step in range(11)]
    assert factors[0] == pytest.approx(1 / 3) and factors[1] == pytest.approx(2 / 3)
    assert factors[2] == pytest.approx(1.0)
    assert factors[2 + 4] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert factors[10] == pytest.approx(0.0)


def test_linear_and_constant():
    assert lr_factor(5, 10, 0, LrSchedule.LINEAR) == pytest.approx(0.5)
    assert lr_factor(9, 10, 0, LrSchedule.CONSTANT) == 1.0


def test_scheduler_drives_optimizer_lr():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=0.1)
    scheduler = build_scheduler(optimizer, total_steps=4, warmup_steps=0,
                                schedule=LrSchedule.LINEAR)
    seen = []
    for _ in range(4):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.1, 0.075, 0.05, 0.025])
