"""A model's repeated blocks, and which of them memory.checkpoint_blocks and
memory.offload_blocks choose.

Both keys count from the input side: a whole number N is the first N blocks (0: none), a
fraction f in (0, 1] the first ceil(f x depth), null all of them. memory.checkpoint_every
applies within the chosen blocks: blocks 0, k, 2k, ... below N are checkpointed, the rule
transformers' own ``every_n_layers`` follows.

Each block is then of one kind, (checkpointed, offloaded, ... one flag per technique acting
on some blocks: their specs' ``BlockRule``, built from the functions here): the planner
measures stand-ins built of one kind and adds up the kinds' per-block bytes
(plan/itemize.py).
"""

from __future__ import annotations

import dataclasses
import math
from fnmatch import fnmatchcase

from torch import nn

from memfit._utils.errors import ConfigError
from memfit.config.schema import MemoryConfig, ModelConfig


def model_blocks(model: nn.Module, memory: MemoryConfig, is_transformers: bool
                 ) -> list[nn.Module]:
    """The blocks in model order: a transformers model's decoder (or encoder) layers, the
    modules its own checkpointing switches; otherwise those of ``choose_blocks``."""
    layers = transformers_layers(model) if is_transformers else []
    return layers or choose_blocks(model, memory)


def transformers_layers(model: nn.Module) -> list[nn.Module]:
    """transformers' GradientCheckpointingLayer modules (outermost only), in model order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    found: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if isinstance(module, GradientCheckpointingLayer):
            found.append(module)
            inside.update(id(inner) for inner in module.modules())
    return found


def choose_blocks(model: nn.Module, memory: MemoryConfig) -> list[nn.Module]:
    """Blocks named by ``memory.checkpoint_modules`` (outermost only, in model order), or
    by default the items of the largest ModuleList / Sequential (the repeated blocks)."""
    if not memory.checkpoint_modules:
        return _largest_block_list(model)
    chosen: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(outer + ".") for outer, _ in chosen):
            continue
        if any(type(module).__name__ == p or fnmatchcase(name, p)
               for p in memory.checkpoint_modules):
            chosen.append((name, module))
    if not chosen:
        classes = sorted({type(m).__name__ for n, m in model.named_modules() if n})
        raise ConfigError(f"memory.checkpoint_modules={list(memory.checkpoint_modules)} "
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
        raise ConfigError("memory.gradient_checkpointing / memory.offload_blocks: this model "
                          "has no nn.ModuleList or nn.Sequential of repeated blocks; name the "
                          "blocks in memory.checkpoint_modules")
    best = max(containers, key=lambda c: (sum(p.numel() for p in c.parameters()), len(c)))
    return list(best)


def model_named(model: ModelConfig) -> str:
    """The model as the user named it, for messages: ``model.preset=llama-3.1-8b``."""
    for key in ("path", "preset", "factory"):
        value = getattr(model, key)
        if value:
            return f"model.{key}={value}"
    return "the model"


def chosen_count(key: str, value: int | float | None, depth: int, named: str) -> int:
    """How many of ``depth`` blocks ``memory.<key>`` chooses; a count beyond the depth is a
    ConfigError naming it and the valid range."""
    if value is None:
        return depth
    if isinstance(value, float):
        # round(): 0.1 x 30 is 3.0000000000000004 in floats, one block more than asked for.
        return math.ceil(round(value * depth, 9))
    if value > depth:
        raise ConfigError(f"memory.{key}={value} is beyond the {depth} blocks of {named}; "
                          f"choose 0..{depth} or a fraction")
    return value


def checkpointed_count(memory: MemoryConfig, depth: int, named: str) -> int:
    """Blocks that recompute in backward: every k-th of the chosen ones."""
    return sum(checkpointed(memory, depth, named))


def checkpointed(memory: MemoryConfig, depth: int, named: str) -> list[bool]:
    """Per block, input side first: recomputed in backward (memory.checkpoint_blocks,
    checkpoint_every)?"""
    chosen = chosen_count("checkpoint_blocks", memory.checkpoint_blocks, depth, named)
    return [index < chosen and index % memory.checkpoint_every == 0 for index in range(depth)]


def checkpointed_everywhere(memory: MemoryConfig, acts: bool) -> MemoryConfig:
    """``memory`` with every block checkpointed, or none."""
    return dataclasses.replace(memory, checkpoint_blocks=None if acts else 0,
                               checkpoint_every=1)


def offloaded(memory: MemoryConfig, depth: int, named: str) -> list[bool]:
    """Per block: are its saved tensors offloaded (memory.offload_blocks)?"""
    chosen = chosen_count("offload_blocks", memory.offload_blocks, depth, named)
    return [index < chosen for index in range(depth)]


def offloaded_everywhere(memory: MemoryConfig, acts: bool) -> MemoryConfig:
    """``memory`` with every block offloaded, or none; offload_blocks null (the whole model,
    outside the blocks too) stays."""
    if memory.offload_blocks is None:
        return memory
    return dataclasses.replace(memory, offload_blocks=1.0 if acts else 0)
