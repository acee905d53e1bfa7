"""Activation checkpointing (memory.gradient_checkpointing): techniques/checkpointing.py."""

from __future__ import annotations

from torch import nn

from memfit.config.ignored import Rule
from memfit.techniques import checkpointing
from memfit.techniques.blocks import checkpointed, checkpointed_everywhere, model_named
from memfit.techniques.specs.spec import BlockRule, Setting, TechniqueOptions, TechniqueSpec


def apply(model: nn.Module, setting: Setting) -> nn.Module:
    return checkpointing.apply(model, setting.options.memory, setting.is_transformers,
                               model_named(setting.options.model))


def check_applied(model: nn.Module, options: TechniqueOptions) -> list[str]:
    checkpointing.check_applied(model, options.memory)
    return []


SPEC = TechniqueSpec(
    name="activation checkpointing",
    docs_row="activation checkpointing: blocks recomputed in backward",
    keys=("memory.gradient_checkpointing", "memory.checkpoint_modules",
          "memory.checkpoint_every", "memory.checkpoint_blocks"),
    stage="model", enabled=lambda options: options.memory.gradient_checkpointing,
    plan="traced: recomputed blocks keep only their inputs; with memory.checkpoint_blocks, "
         "stand-ins of checkpointed and of plain blocks, added up per kind",
    # Before the adapters: PEFT renames the modules checkpointing looks for.
    apply=apply, check_applied=check_applied, plan_apply=apply,
    # A +ckpt row checkpoints every block (its +fit row searches how many); the user's
    # memory.checkpoint_modules stays: it says which modules are the blocks.
    row_reset=("memory.gradient_checkpointing", "memory.checkpoint_every",
               "memory.checkpoint_blocks"), level="+ckpt",
    blocks=BlockRule(checkpointed, checkpointed_everywhere),
    ignored=(Rule(("memory.checkpoint_modules", "memory.checkpoint_every",
                   "memory.checkpoint_blocks"),
                  lambda c: not c.memory.gradient_checkpointing,
                  lambda c: "it applies with memory.gradient_checkpointing=true"),))
