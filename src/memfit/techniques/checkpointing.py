"""Activation checkpointing: keep only block inputs in forward, recompute in backward.

- Hugging Face models: transformers' own per-layer checkpointing, non-reentrant so that
  gradients reach adapters even when the block inputs do not require grad (with
  ``use_reentrant=True`` a frozen base silently cuts them off: transformers #26221).
- Any other nn.Module: the chosen blocks' ``forward`` is replaced (on the instance, so
  parameter names and state_dict keys do not change) by a non-reentrant
  ``torch.utils.checkpoint`` of the original.

Which blocks, and how many of them (memory.checkpoint_blocks, memory.checkpoint_every):
techniques/blocks.py.
"""

from __future__ import annotations

import functools
from typing import Any

import torch.utils.checkpoint
from torch import nn

from memfit._utils.errors import ConfigError
from memfit.config.schema import MemoryConfig
from memfit.techniques import blocks


class CheckpointedForward:
    """An instance-level ``forward`` that runs the original under checkpoint."""

    def __init__(self, forward: Any):
        self.original = forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return torch.utils.checkpoint.checkpoint(self.original, *args, use_reentrant=False,
                                                 **kwargs)


def apply(model: nn.Module, config: MemoryConfig, is_transformers: bool,
          named: str = "this model") -> nn.Module:
    """A transformers model checkpoints its own layers; one that cannot (ResNet:
    ``supports_gradient_checkpointing`` false) and any other module: its repeated blocks.
    Of the blocks, the first ``memory.checkpoint_blocks`` (every ``checkpoint_every``-th
    of them) are checkpointed; ``named`` names the model in the error for a count beyond
    its depth."""
    if is_transformers and getattr(model, "supports_gradient_checkpointing", True):
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is None:  # transformers releases before the activation_* names
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        layers = blocks.transformers_layers(model)
        chosen = blocks.chosen_count("checkpoint_blocks", config.checkpoint_blocks,
                                     len(layers), named)
        # Every layer got the checkpoint function; its own flag says whether it runs
        # under it (layers 0, k, 2k, ... below N, as transformers' every_n_layers counts).
        for index, layer in enumerate(layers):
            layer.gradient_checkpointing = index < chosen and index % config.checkpoint_every == 0
        return model
    found = blocks.choose_blocks(model, config)
    chosen = blocks.chosen_count("checkpoint_blocks", config.checkpoint_blocks, len(found),
                                 named)
    for block in found[:chosen][::config.checkpoint_every]:
        block.forward = CheckpointedForward(block.forward)
    return model


def checkpointed_blocks(model: nn.Module) -> int:
    """How many blocks will recompute in backward (for the "did it apply?" check)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    count = 0
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), CheckpointedForward):
            count += 1
        elif isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing:
            function = getattr(module, "_gradient_checkpointing_func", None)
            keywords = function.keywords if isinstance(function, functools.partial) else {}
            if keywords.get("use_reentrant", True) is False:
                count += 1
    return count


def check_applied(model: nn.Module, config: MemoryConfig | None = None) -> None:
    """As many blocks checkpointed (non-reentrant) as ``config`` asks for: exactly, for a
    transformers model's layers (its flags could have been reset or made reentrant);
    at least one otherwise, unless memory.checkpoint_blocks=0."""
    config = config or MemoryConfig(gradient_checkpointing=True)
    count = checkpointed_blocks(model)
    layers = blocks.transformers_layers(model)
    wrapped = any(isinstance(m.__dict__.get("forward"), CheckpointedForward)
                  for m in model.modules())
    if layers and not wrapped:
        wanted = blocks.checkpointed_count(config, len(layers), "this model")
        if count != wanted:
            raise ConfigError(f"memory.gradient_checkpointing=true should checkpoint {wanted} "
                              f"of this model's {len(layers)} blocks (non-reentrant), "
                              f"{count} are")
    elif count == 0 and config.checkpoint_blocks != 0:
        raise ConfigError("memory.gradient_checkpointing=true but no block of this model is "
                          "checkpointed (non-reentrant); name blocks in "
                          "memory.checkpoint_modules")
