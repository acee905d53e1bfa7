"""``model.factory`` models for the distributed tests: a plain regression (for tests of
the launch, not of the model: a worker builds it without importing transformers), and
models that misbehave on rank 1 alone: one raises on its third forward while rank 0 waits
for it in a collective (the failing-rank test); one overflows its fp16 gradient in its
second step (the gradient scaler must skip it on every rank)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch import nn

FAILURE = "rank 1 failed on purpose at forward 3"


class Regression(nn.Module):
    """Two ReLU blocks and a linear head on 8 features: the model these tests break."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.head = nn.Linear(8, 1)

    def output(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = inputs
        for block in self.blocks:
            hidden = torch.relu(block(hidden))
        return self.head(hidden)


class PlainRegression(Regression):
    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.output(inputs), targets)


def regression() -> nn.Module:
    return PlainRegression()


def regression_config(root: Path, name: str, strategy: str, **train: int) -> Path:
    """root/NAME.yaml: this module's regression on root/rows.npz, written to root/NAME, as
    ``strategy`` with ``train`` keys over 2 steps of micro-batches of 2."""
    config = root / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"factory": "dist_factories:regression", "task": "custom"},
        "data": {"path": str(write_regression_rows(root / "rows.npz")), "format": "tensors",
                 "eval_fraction": 0},
        "train": {"output_dir": str(root / name), "max_steps": 2, "micro_batch_size": 2,
                  **train},
        "distributed": {"strategy": strategy},
        "log": {"progress": False, "tensorboard": False}}))
    return config


def write_regression_rows(path: Path) -> Path:
    """32 rows of 8 features and 1 target (.npz, data.format=tensors)."""
    generator = np.random.default_rng(0)
    np.savez(path, inputs=generator.normal(size=(32, 8)).astype(np.float32),
             targets=generator.normal(size=(32, 1)).astype(np.float32))
    return path


class FailsOnRankOne(Regression):
    def __init__(self):
        super().__init__()
        self.forwards = 0

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        if dist.get_rank() == 1 and self.forwards == 3:
            raise RuntimeError(FAILURE)
        return F.mse_loss(self.output(inputs), targets)


def fails_on_rank_one() -> nn.Module:
    return FailsOnRankOne()


class _InfGradientOnRankOne(torch.autograd.Function):
    """Identity whose backward, on rank 1 only and in the model's second backward, makes
    the gradient inf (the loss stays finite)."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, model: nn.Module) -> torch.Tensor:
        ctx.model = model
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.model.backwards += 1
        if dist.get_rank() == 1 and ctx.model.backwards == 2:
            grad = grad * float("inf")
        return grad, None


class InfGradientOnRankOne(Regression):
    """A regression whose gradient overflows on rank 1 alone, in its second step."""

    def __init__(self):
        super().__init__()
        self.backwards = 0

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        output = _InfGradientOnRankOne.apply(self.output(inputs), self)
        return F.mse_loss(output.float(), targets)


def inf_gradient_on_rank_one() -> nn.Module:
    return InfGradientOnRankOne()
