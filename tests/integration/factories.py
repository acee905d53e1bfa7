"""Plain nn.Module factories used through `model.factory` in end-to-end tests."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Regressor(nn.Module):
    """forward(**batch) returns the mean loss: the documented factory-model convention.
    Dropout makes resume depend on restoring the RNG state."""

    def __init__(self, seconds_per_forward: float = 0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
        self.seconds_per_forward = seconds_per_forward

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.seconds_per_forward:
            time.sleep(self.seconds_per_forward)  # slow enough for a kill to land mid-run
        return F.mse_loss(self.net(inputs), targets)


def regressor() -> nn.Module:
    return Regressor()


def slow_regressor() -> nn.Module:
    return Regressor(seconds_per_forward=0.03)


def write_regression_data(path, rows: int = 64, seed: int = 0):
    generator = np.random.default_rng(seed)
    inputs = generator.normal(size=(rows, 8)).astype(np.float32)
    targets = (inputs @ generator.normal(size=(8, 1))).astype(np.float32)
    np.savez(path, inputs=inputs, targets=targets)
    return path
