"""The factory model of benchmarks/plan_time.py: a convolutional autoencoder on
3 x 64 x 64 images: a strided stem (3 -> 64 channels, 32 x 32), a list of residual
3 x 3 conv blocks at 64 x 32 x 32 (the repeated blocks checkpointing wraps), and a
transposed convolution back to 3 x 64 x 64; its loss the reconstruction's mean squared
error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CHANNELS, BLOCKS = 64, 4


class ConvBlock(nn.Module):
    """x + conv(relu(conv(x))), shape kept: [batch, CHANNELS, 32, 32]."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)
        self.second = nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.second(F.relu(self.first(x)))


class ConvAutoencoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, CHANNELS, 3, stride=2, padding=1)
        self.blocks = nn.ModuleList(ConvBlock() for _ in range(BLOCKS))
        self.head = nn.ConvTranspose2d(CHANNELS, 3, 4, stride=2, padding=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(images))
        for block in self.blocks:
            x = block(x)
        return F.mse_loss(self.head(x), images)


def conv_autoencoder() -> nn.Module:
    return ConvAutoencoder()
