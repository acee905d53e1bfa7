"""Small plain modules shared by the technique tests (built in the tests, random weights)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """A ViT-style block: attention projections (qkv fused + proj) and an MLP."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.attn = nn.ModuleDict({"qkv": nn.Linear(width, 3 * width),
                                   "proj": nn.Linear(width, width)})
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(),
                                 nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.attn["qkv"](x).chunk(3, dim=-1)
        x = x + self.attn["proj"](F.scaled_dot_product_attention(q, k, v))
        return x + self.mlp(x)


class Autoencoder(nn.Module):
    """Conv stem -> transformer blocks -> linear decoder: the seed's autoencoder shape.
    forward(images) -> reconstruction [batch, 1, 8, 8]."""

    def __init__(self, width: int = 32, depth: int = 3):
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.stem = nn.Conv2d(1, width, kernel_size=2, stride=2)   # 8x8 -> 4x4 tokens
        self.encoder.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.decoder = nn.Module()
        self.decoder.conv = nn.Conv2d(width, width, kernel_size=1)
        self.decoder.out = nn.Linear(width, 4)                              # 2x2 pixels per token

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.encoder.stem(images)                      # [b, w, 4, 4]
        tokens = x.flatten(2).transpose(1, 2)              # [b, 16, w]
        for block in self.encoder.blocks:
            tokens = block(tokens)
        x = self.decoder.conv(tokens.transpose(1, 2).reshape_as(x))
        pixels = self.decoder.out(x.flatten(2).transpose(1, 2))  # [b, 16, 4]
        b = images.shape[0]
        return pixels.reshape(b, 4, 4, 2, 2).permute(0, 1, 3, 2, 4).reshape(b, 1, 8, 8)


def reconstruction_loss(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(images), images)
