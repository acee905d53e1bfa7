"""A ``model.factory`` model for the failing-rank test: rank 1 raises on its third
forward, while rank 0 is waiting for it in a collective."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

FAILURE = "rank 1 failed on purpose at forward 3"


class FailsOnRankOne(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.head = nn.Linear(8, 1)
        self.forwards = 0

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        if dist.get_rank() == 1 and self.forwards == 3:
            raise RuntimeError(FAILURE)
        hidden = inputs
        for block in self.blocks:
            hidden = torch.relu(block(hidden))
        return F.mse_loss(self.head(hidden), targets)


def fails_on_rank_one() -> nn.Module:
    return FailsOnRankOne()
