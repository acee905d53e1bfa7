"""Tiled MLP (memory.tiled_mlp): techniques/tiled_mlp.py."""

from __future__ import annotations

from torch import nn

from memfit.config.ignored import Rule
from memfit.techniques.specs.spec import Setting, TechniqueOptions, TechniqueSpec
from memfit.techniques.tiled_mlp import MLPS


def apply(model: nn.Module, setting: Setting) -> nn.Module:
    return MLPS.apply(model, setting.options.memory.mlp_chunk_tokens)


def check_applied(model: nn.Module, options: TechniqueOptions) -> list[str]:
    MLPS.check_applied(model)
    return []


SPEC = TechniqueSpec(
    name="tiled MLP",
    docs_row=("sequence-tiled MLP (one chunk's `tokens x intermediate` activations at a time, "
              "recomputed in backward)"),
    keys=("memory.tiled_mlp", "memory.mlp_chunk_tokens"),
    stage="model", enabled=lambda options: options.memory.tiled_mlp,
    plan="traced: the MLPs run chunk by chunk on the fake tensors, as in training",
    # Before the adapters; the trainable parameters are looked up at each call.
    apply=apply, check_applied=check_applied, plan_apply=apply,
    row_reset=("memory.tiled_mlp",), level="+ckpt",
    ignored=(Rule(("memory.mlp_chunk_tokens",), lambda c: not c.memory.tiled_mlp,
                  lambda c: "it applies with memory.tiled_mlp=true"),))
