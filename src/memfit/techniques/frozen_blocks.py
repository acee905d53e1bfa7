"""memory.freeze_blocks: a full fine-tune that leaves the first N of the model's repeated
blocks (counted from the input side, as memory.checkpoint_blocks counts them:
techniques/blocks.py) as they are. Frozen, their weights take no gradient and no optimizer
state; backward still runs through them where something below them trains (the input
embedding, unless memory.freeze_embeddings).
"""

from __future__ import annotations

from torch import nn

from memfit._utils.errors import ConfigError
from memfit.config.schema import MemoryConfig
from memfit.techniques import blocks


def freeze_first(model: nn.Module, count: int | float, memory: MemoryConfig,
                 is_transformers: bool, named: str) -> nn.Module:
    """Freeze the first ``count`` blocks (a float: that share of them); a count beyond the
    depth is a ConfigError naming both."""
    found = blocks.model_blocks(model, memory, is_transformers)
    for block in found[:blocks.chosen_count("freeze_blocks", count, len(found), named)]:
        block.requires_grad_(False)
    return model


def check_applied(model: nn.Module, count: int | float) -> None:
    """With blocks to freeze, some weight is frozen and some still trains."""
    trains = [p.requires_grad for p in model.parameters()]
    if count > 0 and all(trains):
        raise ConfigError(f"memory.freeze_blocks={count} froze no weight: the model has no "
                          "blocks it could find (name them in memory.checkpoint_modules)")
    if not any(trains):
        raise ConfigError(f"memory.freeze_blocks={count} left nothing to train; freeze fewer "
                          "blocks")
