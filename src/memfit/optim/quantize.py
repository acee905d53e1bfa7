"""Block-wise 8-bit quantisation of optimizer moments, in plain torch (CPU and CUDA).

Each block of BLOCK_SIZE values is divided by its absolute maximum and every normalised
value is stored as the index (uint8) of the nearest entry of a fixed 256-entry code. The
code is log-spaced so the *relative* error is roughly constant across magnitudes (like the
dynamic code of 8-bit Adam, Dettmers et al. 2022): Adam's second moment spans many orders
of magnitude inside one block, and a linear code would flush its small entries to zero and
blow up the update m / sqrt(v).

Storage per tensor: numel bytes of codes (padded to a whole block) + 4 bytes per block.
"""

from __future__ import annotations

import torch

BLOCK_SIZE = 256

# Signed code (first moment): 0, +-10^[-7, 0] log-spaced; 127 negative + 0 + 128 positive.
# Unsigned code (second moment, >= 0): 0 and 255 values log-spaced over 10^[-14, 0]; the
# range is the square of the signed one because v ~ g**2 while m ~ g.
_POSITIVE = torch.logspace(-7.0, 0.0, 128, dtype=torch.float64)
_SIGNED_CODE = torch.cat([-_POSITIVE[1:].flip(0), torch.zeros(1, dtype=torch.float64), _POSITIVE])
_UNSIGNED_CODE = torch.cat(
    [torch.zeros(1, dtype=torch.float64), torch.logspace(-14.0, 0.0, 255, dtype=torch.float64)]
)


def _code(signed: bool, device: torch.device) -> torch.Tensor:
    return (_SIGNED_CODE if signed else _UNSIGNED_CODE).to(device=device, dtype=torch.float32)


def _midpoints(code: torch.Tensor) -> torch.Tensor:
    # Boundaries between neighbouring code values: bucketize against them = nearest entry.
    return (code[1:] + code[:-1]) / 2


def quantize_blockwise(x: torch.Tensor, signed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise `x` (any shape, float) to (codes uint8 [blocks*256], absmax fp32 [blocks])."""
    numel = x.numel()
    # A zero-padded fp32 copy, normalised in place: the only full-size fp32 temporary.
    blocks = torch.zeros(-(-numel // BLOCK_SIZE) * BLOCK_SIZE, dtype=torch.float32,
                         device=x.device)
    blocks[:numel].copy_(x.detach().reshape(-1))
    blocks = blocks.view(-1, BLOCK_SIZE)
    absmax = torch.linalg.vector_norm(blocks, ord=float("inf"), dim=1)  # max |value|
    # An all-zero block has absmax 0; divide by 1 instead so it encodes as exact zeros.
    blocks.div_(torch.where(absmax > 0, absmax, torch.ones_like(absmax)).unsqueeze(1))
    codes = torch.bucketize(blocks, _midpoints(_code(signed, x.device)), out_int32=True)
    return codes.to(torch.uint8).view(-1), absmax


def quantized_zeros(
    numel: int, signed: bool, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_blockwise(torch.zeros(numel), signed) without the fp32 zeros."""
    blocks = -(-numel // BLOCK_SIZE)
    cpu_code = _code(signed, torch.device("cpu"))
    zero_code = int(torch.bucketize(torch.zeros(1), _midpoints(cpu_code)))
    codes = torch.full((blocks * BLOCK_SIZE,), zero_code, dtype=torch.uint8, device=device)
    return codes, torch.zeros(blocks, dtype=torch.float32, device=device)


def dequantize_blockwise(
    codes: torch.Tensor, absmax: torch.Tensor, shape: torch.Size, signed: bool
) -> torch.Tensor:
    """Inverse of quantize_blockwise: fp32 tensor of `shape`."""
    # int32 indices: a long copy of the codes would be 8 bytes per value.
    values = _code(signed, codes.device).index_select(0, codes.int()).view(-1, BLOCK_SIZE)
    values.mul_(absmax.unsqueeze(1))
    numel = 1
    for size in shape:
        numel *= size
    return values.view(-1)[:numel].view(shape)


def quantized_bytes(numel: int) -> int:
    """Bytes one quantised tensor of `numel` values occupies (codes + per-block absmax)."""
    blocks = -(-numel // BLOCK_SIZE)
    return blocks * BLOCK_SIZE + 4 * blocks
