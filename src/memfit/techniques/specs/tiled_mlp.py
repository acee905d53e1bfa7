"""Tiled MLP (memory.tiled_mlp): techniques/tiled_mlp.py. Its chunk size,
memory.mlp_chunk_tokens, is its own key (declared here, not in the schema)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from memfit.config.fields import doc
from memfit.config.ignored import Rule
from memfit.config.limits import MAX_TOKENS
from memfit.techniques.own_keys import technique_options
from memfit.techniques.specs.spec import Setting, TechniqueOptions, TechniqueSpec
from memfit.techniques.tiled_mlp import MLPS

NAME = "tiled MLP"


@dataclass(frozen=True)
class TiledMlpOptions:
    mlp_chunk_tokens: int = doc(
        "Tokens whose MLP activations exist at once (forward and backward), with "
        "memory.tiled_mlp.",
        limits=(1, MAX_TOKENS), default=4096)


def apply(model: nn.Module, setting: Setting) -> nn.Module:
    options = technique_options(TiledMlpOptions, setting.options.memory, NAME)
    return MLPS.apply(model, options.mlp_chunk_tokens)


def check_applied(model: nn.Module, options: TechniqueOptions) -> list[str]:
    MLPS.check_applied(model)
    return []


SPEC = TechniqueSpec(
    name=NAME,
    docs_row=("sequence-tiled MLP (one chunk's `tokens x intermediate` activations at a time, "
              "recomputed in backward)"),
    keys=("memory.tiled_mlp", "memory.mlp_chunk_tokens"), own=TiledMlpOptions,
    stage="model", enabled=lambda options: options.memory.tiled_mlp,
    plan="traced: the MLPs run chunk by chunk on the fake tensors, as in training",
    # Before the adapters; the trainable parameters are looked up at each call.
    apply=apply, check_applied=check_applied, plan_apply=apply,
    row_reset=("memory.tiled_mlp",), level="+ckpt",
    ignored=(Rule(("memory.mlp_chunk_tokens",), lambda c: not c.memory.tiled_mlp,
                  lambda c: "it applies with memory.tiled_mlp=true"),))
