"""Tiled norms (memory.tiled_norms): techniques/tiled_norms.py. Its chunk size,
memory.norm_chunk_tokens, is its own key (declared here, not in the schema)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from memfit.config.fields import doc
from memfit.config.ignored import Rule
from memfit.config.limits import MAX_TOKENS
from memfit.techniques.own_keys import technique_options
from memfit.techniques.specs.spec import Setting, TechniqueOptions, TechniqueSpec
from memfit.techniques.tiled_norms import NORMS

NAME = "tiled norms"


@dataclass(frozen=True)
class TiledNormsOptions:
    norm_chunk_tokens: int = doc(
        "Tokens whose norm temporaries exist at once (forward and backward), with "
        "memory.tiled_norms.", limits=(1, MAX_TOKENS), default=4096)


def apply(model: nn.Module, setting: Setting) -> nn.Module:
    options = technique_options(TiledNormsOptions, setting.options.memory, NAME)
    return NORMS.apply(model, options.norm_chunk_tokens)


def check_applied(model: nn.Module, options: TechniqueOptions) -> list[str]:
    NORMS.check_applied(model)
    return []


SPEC = TechniqueSpec(
    name=NAME,
    docs_row=("sequence-tiled RMSNorm / LayerNorm (the norm keeps its input, not an fp32 "
              "copy; one chunk's fp32 work at a time, recomputed in backward)"),
    keys=("memory.tiled_norms", "memory.norm_chunk_tokens"), own=TiledNormsOptions,
    stage="model", enabled=lambda options: options.memory.tiled_norms,
    plan="traced: the norms run chunk by chunk on the fake tensors, as in training",
    apply=apply, check_applied=check_applied, plan_apply=apply,
    row_reset=("memory.tiled_norms",), level="+ckpt",
    ignored=(Rule(("memory.norm_chunk_tokens",), lambda c: not c.memory.tiled_norms,
                  lambda c: "it applies with memory.tiled_norms=true"),),
    # bf16 autocast, as long sequences train: the untiled norms' fp32 copies are what goes.
    plan_case={"optimizer": {"name": "adamw"}, "precision": "bf16",
               "memory": {"tiled_norms": True, "norm_chunk_tokens": 32}})
