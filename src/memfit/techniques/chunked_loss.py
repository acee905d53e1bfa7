"""Chunked causal-LM loss: the fp32 ``batch x seq x vocab`` logits never exist at once.

The decoder's final hidden states ``[batch, seq, hidden]`` are computed once; only the
positions that carry a label are kept (prompt and padding tokens never get logits), and
the output layer + cross-entropy run over ``chunk_tokens`` of them at a time. Each chunk
is checkpointed, so backward recomputes that chunk's logits instead of keeping them: the
largest loss-related tensor alive is ``chunk_tokens x vocab`` in fp32, plus its gradient.
The result is the same summed loss and the same gradients as the unchunked computation
(only the order of the floating-point sum differs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from memfit._utils.errors import ConfigError
from memfit.distributed.fsdp import is_sharded
from memfit.models.export_module import plain_module
from memfit.models.packed import causal_lm_inputs

IGNORE_INDEX = -100


def loss_sum(hidden: torch.Tensor, labels: torch.Tensor, output_layer: nn.Module,
             chunk_tokens: int) -> torch.Tensor:
    """Summed next-token cross-entropy. hidden: [batch, seq, hidden]; labels: [batch, seq],
    -100 where there is no target; position t predicts token t+1."""
    return targets_loss_sum(hidden[:, :-1], labels[:, 1:], output_layer, chunk_tokens)


def targets_loss_sum(hidden: torch.Tensor, targets: torch.Tensor, output_layer: nn.Module,
                     chunk_tokens: int) -> torch.Tensor:
    """Summed cross-entropy of already shifted targets: hidden [batch, seq, hidden] at
    position t predicts targets [batch, seq] at t (sequence parallelism shifts the whole
    sequence before slicing it)."""
    targets = targets.reshape(-1)                               # [batch * seq]
    keep = targets != IGNORE_INDEX
    states = hidden.reshape(-1, hidden.size(-1))[keep]          # [tokens, hidden]
    targets = targets[keep]                                     # [tokens]
    # No labelled token: a zero that still backpropagates, as cross_entropy's would.
    total = states.sum().float() * 0.0
    for start in range(0, targets.numel(), chunk_tokens):
        total = total + torch.utils.checkpoint.checkpoint(
            _chunk_loss_sum, states[start:start + chunk_tokens],
            targets[start:start + chunk_tokens], output_layer, use_reentrant=False)
    return total


def _chunk_loss_sum(states: torch.Tensor, targets: torch.Tensor,
                    output_layer: nn.Module) -> torch.Tensor:
    logits = output_layer(states).float()  # [chunk, vocab], freed when this returns
    return F.cross_entropy(logits, targets, reduction="sum")


def check_supported(model: nn.Module) -> None:
    """The chunked path computes ``lm_head(decoder(x))``; models that transform logits
    further (soft-capping, scaling) would get a different loss, so they are refused."""
    inner = plain_module(model)
    config = getattr(inner, "config", None)
    if not (callable(getattr(inner, "get_decoder", None))
            and callable(getattr(inner, "get_output_embeddings", None))
            and inner.get_output_embeddings() is not None):
        raise ConfigError("memory.chunked_loss needs a transformers causal LM "
                          "(a decoder and an output layer); set memory.chunked_loss=false")
    for attribute in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        if getattr(config, attribute, None) not in (None, 1, 1.0):
            raise ConfigError(f"memory.chunked_loss is not supported for models with "
                              f"{attribute} set; set memory.chunked_loss=false")


# The name under which an FSDP2 root runs a loss as a forward method.
_FSDP_FORWARD = "memfit_loss_sum"


def through_root(model: nn.Module, loss: Callable[..., torch.Tensor], *args: Any
                 ) -> torch.Tensor:
    """``loss(model, *args)``; under FSDP2 as a forward method of the root unit: the
    chunked loss calls the decoder and the output layer around the root's forward, so
    without it the weights the root holds (embeddings, final norm, output layer) stay
    sharded and their gradients unreduced; the root's hooks gather them and register
    the reduce-scatter."""
    if not is_sharded(model):
        return loss(model, *args)
    if _FSDP_FORWARD not in vars(model):
        from torch.distributed.fsdp import register_fsdp_forward_method  # imported by sharding

        setattr(model, _FSDP_FORWARD, functools.partial(_call, model))
        register_fsdp_forward_method(model, _FSDP_FORWARD)
    return getattr(model, _FSDP_FORWARD)(loss, *args)


def _call(model: nn.Module, loss: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    return loss(model, *args)


def causal_lm_loss_sum(model: nn.Module, batch: dict[str, torch.Tensor],
                       chunk_tokens: int) -> torch.Tensor:
    return through_root(model, _causal_lm_loss_sum, batch, chunk_tokens)


def _causal_lm_loss_sum(model: nn.Module, batch: dict[str, torch.Tensor],
                        chunk_tokens: int) -> torch.Tensor:
    inner = plain_module(model)
    inputs, labels = causal_lm_inputs(inner, batch)  # padded rows, or packed blocks
    outputs = inner.get_decoder()(**inputs)
    return loss_sum(outputs.last_hidden_state, labels, inner.get_output_embeddings(),
                    chunk_tokens)
