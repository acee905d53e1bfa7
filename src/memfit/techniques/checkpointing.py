"""Activation checkpointing: keep only block inputs in forward, recompute in backward.

- Hugging Face models: transformers' own per-layer checkpointing, non-reentrant so that
  gradients reach adapters even when the block inputs do not require grad (with
  ``use_reentrant=True`` a frozen base silently cuts them off: transformers #26221).
- Any other nn.Module: the chosen blocks' ``forward`` is replaced (on the instance, so
  parameter names and state_dict keys do not change) by a non-reentrant
  ``torch.utils.checkpoint`` of the original.
"""

from __future__ import annotations

import functools
from fnmatch import fnmatchcase
from typing import Any

import torch.utils.checkpoint
from torch import nn

from memfit._utils.errors import ConfigError
from memfit.config.schema import MemoryConfig


class CheckpointedForward:
    """An instance-level ``forward`` that runs the original under checkpoint."""

    def __init__(self, forward: Any):
        self.original = forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return torch.utils.checkpoint.checkpoint(self.original, *args, use_reentrant=False,
                                                 **kwargs)


def apply(model: nn.Module, config: MemoryConfig, is_transformers: bool) -> nn.Module:
    """A transformers model checkpoints its own layers; one that cannot (ResNet:
    ``supports_gradient_checkpointing`` false) and any other module: its repeated blocks."""
    if is_transformers and getattr(model, "supports_gradient_checkpointing", True):
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is None:  # transformers releases before the activation_* names
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            enable(activation_checkpointing_kwargs={"use_reentrant": False},
                   every_n_layers=config.checkpoint_every)
        return model
    for block in choose_blocks(model, config)[::config.checkpoint_every]:
        block.forward = CheckpointedForward(block.forward)
    return model


def choose_blocks(model: nn.Module, config: MemoryConfig) -> list[nn.Module]:
    """Blocks named by ``memory.checkpoint_modules`` (outermost only, in model order), or
    by default the items of the largest ModuleList / Sequential (the repeated blocks)."""
    if not config.checkpoint_modules:
        return _largest_block_list(model)
    chosen: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(outer + ".") for outer, _ in chosen):
            continue
        if any(type(module).__name__ == p or fnmatchcase(name, p)
               for p in config.checkpoint_modules):
            chosen.append((name, module))
    if not chosen:
        classes = sorted({type(m).__name__ for n, m in model.named_modules() if n})
        raise ConfigError(f"memory.checkpoint_modules={list(config.checkpoint_modules)} "
                          f"matches no module; classes here: {', '.join(classes)}")
    return [module for _, module in chosen]


def _largest_block_list(model: nn.Module) -> list[nn.Module]:
    # Repeated blocks: a container holding several modules of one class with weights.
    def repeated(container: nn.Module) -> bool:
        classes = [type(item) for item in container if any(True for _ in item.parameters())]
        return len(classes) > 1 and len(set(classes)) == 1

    containers = [module for module in model.modules()
                  if isinstance(module, (nn.ModuleList, nn.Sequential)) and repeated(module)]
    if not containers:
        raise ConfigError("memory.gradient_checkpointing: this model has no nn.ModuleList or "
                          "nn.Sequential of repeated blocks; name the blocks in "
                          "memory.checkpoint_modules")
    best = max(containers, key=lambda c: (sum(p.numel() for p in c.parameters()), len(c)))
    return list(best)


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


def check_applied(model: nn.Module) -> None:
    if checkpointed_blocks(model) == 0:
        raise ConfigError("memory.gradient_checkpointing=true but no block of this model is "
                          "checkpointed (non-reentrant); name blocks in "
                          "memory.checkpoint_modules")
