"""Built-in image autoencoders (plain nn.Modules, random weights): ``conv-autoencoder`` and
``vit-autoencoder``, for ``model.task=autoencoder``. ``forward(images) -> reconstruction``,
both of shape (batch, channels, size, size), intensities in [0, 1].

Both keep their two halves as top-level ``encoder`` and ``decoder`` with a repeated block
stack in each (``.blocks``), which is what the LoRA placements (``encoder-late``,
``decoder``) and activation checkpointing look for. Every learned map is an ``nn.Linear``
or ``nn.Conv2d`` (upsampling is nearest-neighbour + Conv2d, not ConvTranspose2d), so PEFT
can put LoRA on any of them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from memfit._utils.errors import ModelError


class ConvBlock(nn.Module):
    """Halve the resolution: (B, C_in, H, W) -> (B, C_out, H/2, W/2)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.down = nn.Conv2d(in_channels, out_channels, 3, stride=2, padding=1)
        self.conv = nn.Conv2d(out_channels, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.conv(F.silu(self.down(x))))


class UpBlock(nn.Module):
    """Double the resolution: (B, C_in, H, W) -> (B, C_out, 2H, 2W)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest")))


class ConvEncoder(nn.Module):
    def __init__(self, channels: int, size: int, widths: tuple[int, ...], latent: int):
        super().__init__()
        ins = (channels, *widths[:-1])
        self.blocks = nn.Sequential(*(ConvBlock(i, o) for i, o in zip(ins, widths, strict=True)))
        self.final_size = size >> len(widths)
        self.to_latent = nn.Linear(widths[-1] * self.final_size**2, latent)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # (B, C, S, S) -> (B, widths[-1], S/2^d, S/2^d) -> (B, latent)
        return self.to_latent(self.blocks(images).flatten(1))


class ConvDecoder(nn.Module):
    def __init__(self, channels: int, final_size: int, widths: tuple[int, ...], latent: int):
        super().__init__()
        self.shape = (widths[-1], final_size, final_size)
        self.from_latent = nn.Linear(latent, widths[-1] * final_size**2)
        # widths reversed, ending at the first width: e.g. (64, 32, 16) -> 64->32->16->16
        outs = (*reversed(widths[:-1]), widths[0])
        ins = tuple(reversed(widths))
        self.blocks = nn.Sequential(*(UpBlock(i, o) for i, o in zip(ins, outs, strict=True)))
        self.head = nn.Conv2d(widths[0], channels, 3, padding=1)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        # (B, latent) -> (B, widths[-1], s, s) -> (B, widths[0], S, S) -> (B, C, S, S)
        x = F.silu(self.from_latent(latent)).unflatten(1, self.shape)
        return self.head(self.blocks(x))


class ConvAutoencoder(nn.Module):
    """Strided-conv encoder, a linear bottleneck of ``latent`` numbers, and a mirrored
    upsampling decoder. ``size`` must be divisible by 2 ** len(widths)."""

    def __init__(self, channels: int = 1, size: int = 32, widths: tuple[int, ...] = (16, 32, 64),
                 latent: int = 128):
        super().__init__()
        if size % (1 << len(widths)):
            raise ModelError(f"conv autoencoder: image size {size} must be divisible by "
                             f"{1 << len(widths)} ({len(widths)} halvings)")
        self.encoder = ConvEncoder(channels, size, tuple(widths), latent)
        self.decoder = ConvDecoder(channels, self.encoder.final_size, tuple(widths), latent)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(images))


class Attention(nn.Module):
    """Multi-head self-attention with separate query / key / value / out projections, so
    LoRA placements can pick query and value alone."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, N, D) -> per head (B, heads, N, D / heads)
        def split(t: torch.Tensor) -> torch.Tensor:
            return t.unflatten(-1, (self.heads, -1)).transpose(1, 2)

        mixed = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)),
                                               split(self.value(x)))
        return self.out(mixed.transpose(1, 2).flatten(2))


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 2):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(OrderedDict(fc1=nn.Linear(dim, dim * mlp_ratio), act=nn.GELU(),
                                             fc2=nn.Linear(dim * mlp_ratio, dim)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VitEncoder(nn.Module):
    def __init__(self, channels: int, size: int, patch: int, dim: int, depth: int, heads: int):
        super().__init__()
        self.patch = patch
        tokens = (size // patch) ** 2
        self.patch_embed = nn.Linear(channels * patch * patch, dim)
        self.position = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # (B, C, S, S) -> patches (B, N, C*p*p) with N = (S/p)^2 -> tokens (B, N, dim)
        patches = F.unfold(images, self.patch, stride=self.patch).transpose(1, 2)
        x = self.patch_embed(patches) + self.position
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


class VitDecoder(nn.Module):
    """Light: narrow the tokens, one (or few) transformer blocks, a linear map to pixels."""

    def __init__(self, channels: int, size: int, patch: int, encoder_dim: int, dim: int,
                 depth: int, heads: int):
        super().__init__()
        self.size, self.patch = size, patch
        self.embed = nn.Linear(encoder_dim, dim)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, channels * patch * patch)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (B, N, dim)
        for block in self.blocks:
            x = block(x)
        patches = self.head(self.norm(x))  # (B, N, C*p*p)
        return F.fold(patches.transpose(1, 2), (self.size, self.size), self.patch,
                      stride=self.patch)


class VitAutoencoder(nn.Module):
    """ViT encoder over non-overlapping ``patch`` x ``patch`` patches (no class token) and
    a light transformer decoder back to pixels. ``size`` must be divisible by ``patch``."""

    def __init__(self, channels: int = 1, size: int = 32, patch: int = 4, dim: int = 64,
                 depth: int = 4, heads: int = 4, decoder_dim: int = 32, decoder_depth: int = 1):
        super().__init__()
        if size % patch:
            raise ModelError(f"vit autoencoder: image size {size} must be divisible by the "
                             f"patch size {patch}")
        self.encoder = VitEncoder(channels, size, patch, dim, depth, heads)
        self.decoder = VitDecoder(channels, size, patch, dim, decoder_dim, decoder_depth,
                                  max(1, heads // 2))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(images))


def conv_autoencoder(channels: int, size: int) -> ConvAutoencoder:
    """16-32-64 channels over three halvings, 128-number bottleneck (~0.3M parameters at
    32x32)."""
    return ConvAutoencoder(channels, size)


def vit_autoencoder(channels: int, size: int) -> VitAutoencoder:
    """Patch 4, width 64, 4 encoder blocks of 4 heads, a 1-block width-32 decoder."""
    return VitAutoencoder(channels, size)


# name -> builder(channels, size); both come from data.images (the model must fit the data).
IMAGE_PRESETS: dict[str, Callable[[int, int], nn.Module]] = {
    "conv-autoencoder": conv_autoencoder,
    "vit-autoencoder": vit_autoencoder,
}
