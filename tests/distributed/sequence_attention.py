"""The all-to-all attention of distributed.sequence_parallel against plain SDPA on the
whole sequence, run inside a torchrun job (ddp_jobs.py, job ``{"sequence_attention": N}``,
N processes to a sequence group): every rank feeds its slice of the same random q/k/v
and checks its slice of the output and of the q/k/v gradients."""

from __future__ import annotations

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from memfit.distributed import sequence_parallel
from memfit.distributed.sequence_parallel import SequenceContext

BATCH, HEADS, KV_HEADS, TOKENS, HEAD_DIM = 2, 8, 4, 12, 8  # groups of 1, 2 or 4


class _Attention(nn.Module):
    """What sdpa_attention_forward reads of a model's attention module."""

    is_causal = True
    num_key_value_groups = HEADS // KV_HEADS


def _whole_inputs() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    shapes = [(BATCH, HEADS, TOKENS, HEAD_DIM), (BATCH, KV_HEADS, TOKENS, HEAD_DIM),
              (BATCH, KV_HEADS, TOKENS, HEAD_DIM), (BATCH, TOKENS, HEADS, HEAD_DIM)]
    return tuple(torch.randn(shape, generator=generator, dtype=torch.float64)
                 for shape in shapes)


def check_attention(padded: bool, size: int) -> None:
    """Output and gradients of every rank's slice, in sequence groups of ``size``
    processes, equal one process's to 1e-12 (float64), with plain causal masking or with
    the second row's last 5 tokens padding."""
    module = _Attention()
    query, key, value, weights = _whole_inputs()
    mask = None
    if padded:
        keys = torch.ones(BATCH, TOKENS, dtype=torch.bool)
        keys[1, -5:] = False
        causal = torch.ones(TOKENS, TOKENS, dtype=torch.bool).tril()
        mask = ((keys[:, None, :] & causal) | torch.eye(TOKENS, dtype=torch.bool))[:, None]
    whole = [tensor.clone().requires_grad_() for tensor in (query, key, value)]
    expected, _ = sdpa_attention_forward(module, *whole, mask)  # [batch, tokens, heads, dim]
    (expected * weights).sum().backward()

    sequence = sequence_parallel.new_group(size)
    local = TOKENS // size
    part = slice(sequence.index * local, (sequence.index + 1) * local)
    mine = [tensor[:, :, part].clone().requires_grad_() for tensor in (query, key, value)]
    output, _ = sequence_parallel.attention_forward(
        module, *mine, None, **{sequence_parallel.CONTEXT_KEYWORD: SequenceContext(sequence,
                                                                                   mask)})
    (output * weights[:, part]).sum().backward()
    torch.testing.assert_close(output, expected[:, part], rtol=1e-12, atol=1e-12)
    for got, reference in zip(mine, whole, strict=True):
        torch.testing.assert_close(got.grad, reference.grad[:, :, part], rtol=1e-12,
                                   atol=1e-12)
