"""Activation checkpointing: keep only block inputs in forward, recompute in backward."""

from __future__ import annotations

from torch import nn

from memfit._utils.errors import ConfigError


def apply(model: nn.Module, is_transformers: bool) -> nn.Module:
    if not is_transformers:
        raise ConfigError(
            "memory.gradient_checkpointing for model.factory models is not yet supported"
        )
    # Non-reentrant checkpointing lets gradients reach adapters even when the block inputs
    # do not require grad (transformers #26221).
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model
