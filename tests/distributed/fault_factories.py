"""``model.factory`` models for the distributed fault tests: a fault that happens on rank 1
only, at its third training forward (step 3: one forward per step, no accumulation)."""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from dist_factories import Regression
from torch import nn


class FaultOnRankOne(Regression):
    def __init__(self, fault: str):
        super().__init__()
        self.fault = fault
        self.training_forwards = 0

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(self.output(inputs), targets)
        if not self.training or dist.get_rank() != 1:
            return loss
        self.training_forwards += 1
        if self.training_forwards != 3:
            return loss
        if self.fault == "nan":
            return loss * math.nan
        if self.fault != "sigterm":
            return loss
        marker = Path("signalled")  # once per folder: the resumed run is not signalled again
        if not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGTERM)
        return loss


def nan_on_rank_one() -> nn.Module:
    return FaultOnRankOne("nan")


def sigterm_on_rank_one() -> nn.Module:
    return FaultOnRankOne("sigterm")


class SlowRegressor(FaultOnRankOne):
    """No fault of its own: slow enough for a signal sent from outside to land mid-run."""

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        time.sleep(0.05)
        return super().forward(inputs, targets)


def slow_regressor() -> nn.Module:
    return SlowRegressor("none")
