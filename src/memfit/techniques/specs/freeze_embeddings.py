"""Frozen embeddings (memory.freeze_embeddings): techniques/frozen_embeddings.py."""

from __future__ import annotations

from torch import nn

from memfit.config.ignored import Rule
from memfit.config.schema import AdapterKind
from memfit.techniques import frozen_embeddings
from memfit.techniques.specs.spec import Setting, TechniqueOptions, TechniqueSpec


def apply(model: nn.Module, setting: Setting) -> nn.Module:
    return frozen_embeddings.freeze(model)


def check_applied(model: nn.Module, options: TechniqueOptions) -> list[str]:
    frozen_embeddings.check_applied(model)
    return []


SPEC = TechniqueSpec(
    name="frozen embeddings",
    docs_row=("full fine-tune with the input embedding and the output layer frozen (no "
              "gradient, no optimizer state)"),
    keys=("memory.freeze_embeddings",),
    stage="model",
    enabled=lambda options: (options.memory.freeze_embeddings
                             and options.adapter.kind is AdapterKind.NONE),
    plan="the meta model's embeddings are frozen as training's: no gradient, no state",
    apply=apply, check_applied=check_applied, plan_apply=apply,
    row_reset=("memory.freeze_embeddings",),  # the full-* rows train every weight
    ignored=(Rule(("memory.freeze_embeddings",),
                  lambda c: c.adapter.kind is not AdapterKind.NONE,
                  lambda c: f"adapter.kind={c.adapter.kind} freezes every base weight already"),),
    plan_case={"optimizer": {"name": "adamw"}, "memory": {"freeze_embeddings": True}})
