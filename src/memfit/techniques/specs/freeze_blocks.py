"""Frozen first blocks (memory.freeze_blocks): techniques/frozen_blocks.py. Its key is its
own (declared here, not in the schema), and it acts on some blocks only: its BlockRule
tells the planner which."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from torch import nn

from memfit._utils.errors import ConfigError
from memfit.config.fields import doc
from memfit.config.ignored import Rule
from memfit.config.limits import MAX_RANK
from memfit.config.schema import AdapterKind, MemoryConfig
from memfit.techniques import blocks, frozen_blocks
from memfit.techniques.own_keys import technique_options
from memfit.techniques.specs.spec import BlockRule, Setting, TechniqueOptions, TechniqueSpec

NAME = "frozen first blocks"


@dataclass(frozen=True)
class FreezeBlocksOptions:
    freeze_blocks: int | float | None = doc(
        "Full fine-tuning: freeze the first N repeated blocks (transformer layers), or that "
        "share of them (a fraction in (0, 1]), counted from the input side as "
        "memory.checkpoint_blocks counts them; they take no gradients and no optimizer "
        "state. null: none.", limits=(0, MAX_RANK), default=None)

    def __post_init__(self) -> None:
        value = self.freeze_blocks
        if isinstance(value, float) and not (math.isfinite(value) and 0 < value <= 1):
            raise ConfigError(f"memory.freeze_blocks={value} as a fraction of the blocks must "
                              "be in (0, 1]; a whole number counts blocks")


def _count(memory: MemoryConfig) -> int | None:
    return technique_options(FreezeBlocksOptions, memory, NAME).freeze_blocks


def _enabled(options: TechniqueOptions) -> bool:
    return _count(options.memory) is not None and options.adapter.kind is AdapterKind.NONE


def _apply(model: nn.Module, setting: Setting) -> nn.Module:
    options = setting.options
    return frozen_blocks.freeze_first(model, _count(options.memory), options.memory,
                                      setting.is_transformers,
                                      blocks.model_named(options.model))


def _check_applied(model: nn.Module, options: TechniqueOptions) -> list[str]:
    frozen_blocks.check_applied(model, _count(options.memory))
    return []


def _frozen(memory: MemoryConfig, depth: int, named: str) -> list[bool]:
    chosen = blocks.chosen_count("freeze_blocks", _count(memory), depth, named)
    return [index < chosen for index in range(depth)]


def _everywhere(memory: MemoryConfig, acts: bool) -> MemoryConfig:
    own = {**memory.own, "freeze_blocks": 1.0 if acts else 0}  # 1.0: all of them
    return dataclasses.replace(memory, own=own)


SPEC = TechniqueSpec(
    name=NAME,
    docs_row="full fine-tune with the first N blocks frozen (no gradient, no optimizer state)",
    keys=("memory.freeze_blocks",), own=FreezeBlocksOptions,
    stage="model", enabled=_enabled,
    plan="the meta model's first blocks are frozen as training's; shortened stand-ins of "
         "frozen and of trained blocks, added up per kind",
    apply=_apply, check_applied=_check_applied, plan_apply=_apply,
    blocks=BlockRule(_frozen, _everywhere),
    row_reset=("memory.freeze_blocks",),  # the full-* rows train every weight
    ignored=(Rule(("memory.freeze_blocks",),
                  lambda c: c.adapter.kind is not AdapterKind.NONE,
                  lambda c: f"adapter.kind={c.adapter.kind} freezes every base weight already"),),
    plan_case={"optimizer": {"name": "adamw"}, "memory": {"freeze_blocks": 1}})
