"""The factory model of benchmarks/plan_time.py: a convolutional autoencoder on
3 x 64 x 64 images (encoder 3 -> 32 -> 64 channels, decoder back), its loss the
reconstruction's mean squared error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvAutoencoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU(),             # 32 x 32 x 32
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),            # 64 x 16 x 16
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),                      # 64 x 16 x 16
            nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1), nn.ReLU(),   # 32 x 32 x 32
            nn.ConvTranspose2d(32, 3, 4, stride=2, padding=1),               # 3 x 64 x 64
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.blocks(images), images)


def conv_autoencoder() -> nn.Module:
    return ConvAutoencoder()
