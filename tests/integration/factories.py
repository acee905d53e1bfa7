"""Plain nn.Module factories used through `model.factory` in end-to-end tests."""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

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


class SamePaddingConv1d(nn.Conv1d):
    """A Conv1d subclass with its own __init__ and a forward that pads, then convolves."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__(channels, channels, kernel_size)
        self.pad = nn.ConstantPad1d(((kernel_size - 1) // 2, kernel_size // 2), 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv1d(self.pad(x), self.weight, self.bias)


class AttentionRegressor(nn.Module):
    """The 8 features as 8 tokens through a same-padding Conv1d subclass, a
    torchvision-style nn.MultiheadAttention and a timm-style fused ``attn.qkv`` Linear."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.embed = nn.Linear(1, width)
        self.mix = SamePaddingConv1d(width, kernel_size=4)
        self.self_attention = nn.MultiheadAttention(width, 2, batch_first=True)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(width, 3 * width)
        self.head = nn.Linear(width, 1)

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.embed(inputs.unsqueeze(-1))  # [b, 8, width]
        x = x + self.mix(x.transpose(1, 2)).transpose(1, 2)
        x = x + self.self_attention(x, x, x, need_weights=False)[0]
        q, k, v = self.attn.qkv(x).chunk(3, dim=-1)
        x = x + F.scaled_dot_product_attention(q, k, v)
        return self.head(x.mean(dim=1))

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.predict(inputs), targets)


def attention_regressor() -> nn.Module:
    return AttentionRegressor()


def slow_regressor() -> nn.Module:
    return Regressor(seconds_per_forward=0.03)


def write_regression_data(path, rows: int = 64, seed: int = 0):
    generator = np.random.default_rng(seed)
    inputs = generator.normal(size=(rows, 8)).astype(np.float32)
    targets = (inputs @ generator.normal(size=(8, 1))).astype(np.float32)
    np.savez(path, inputs=inputs, targets=targets)
    return path


class NanRegressor(Regressor):
    """A Regressor whose loss is nan (and so are its gradients) on the chosen optimizer
    steps, counted by training forwards (one per step without accumulation)."""

    def __init__(self, nan_steps: Callable[[int], bool]):
        super().__init__()
        self.nan_steps = nan_steps
        self.training_forwards = 0

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = super().forward(inputs, targets)
        if not (self.training and torch.is_grad_enabled()):
            return loss
        self.training_forwards += 1
        return loss * math.nan if self.nan_steps(self.training_forwards) else loss


def nan_at_third_step() -> nn.Module:
    return NanRegressor(lambda step: step == 3)


def nan_from_second_step() -> nn.Module:
    return NanRegressor(lambda step: step >= 2)


class SignalsInFirstEval(Regressor):
    """Sends this process SIGTERM from its first evaluation forward, once per working
    directory (a marker file), so a resumed run in the same folder is not signalled again."""

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        marker = Path("signalled")
        if not self.training and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGTERM)
        return super().forward(inputs, targets)


def signals_in_first_eval() -> nn.Module:
    return SignalsInFirstEval()


class BatchNormRegressor(nn.Module):
    """A regressor whose BatchNorm running statistics (buffers, not parameters) change in
    training and decide its evaluation loss: resume must restore them."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(),
                                 nn.Linear(16, 1))

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.net(inputs), targets)


def batchnorm_regressor() -> nn.Module:
    return BatchNormRegressor()


class BatchNormConvNet(nn.Module):
    """Convolutions each followed by BatchNorm, whose running statistics (buffers) move in
    training even where adapters freeze every weight: an export that drops them evaluates
    with mean 0 and variance 1 instead. forward(images, targets) returns the mean loss."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Linear(8, 1)

    def forward(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pooled = self.features(images).mean(dim=(2, 3))  # (batch, 8)
        return F.mse_loss(self.head(pooled).squeeze(-1), targets)


def batchnorm_conv_net() -> nn.Module:
    return BatchNormConvNet()


def write_shifted_images(path, rows: int = 48, seed: int = 0):
    """Images (rows, 3, 8, 8) of mean 10 and deviation 3, far from BatchNorm's initial running
    statistics (mean 0, variance 1), and one target per image."""
    generator = np.random.default_rng(seed)
    images = generator.normal(10.0, 3.0, size=(rows, 3, 8, 8)).astype(np.float32)
    targets = images.mean(axis=(1, 2, 3)) - 10.0
    np.savez(path, images=images, targets=targets.astype(np.float32))
    return path
