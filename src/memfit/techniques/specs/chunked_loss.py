"""Chunked loss (memory.chunked_loss): the causal-LM loss of techniques/chunked_loss.py,
which training's objective (techniques/training_loss.py) runs. Its chunk size,
memory.loss_chunk_tokens, is its own key (declared here, not in the schema)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from memfit.config.fields import doc
from memfit.config.ignored import Rule
from memfit.config.limits import MAX_TOKENS
from memfit.config.schema import MemoryConfig
from memfit.techniques import chunked_loss
from memfit.techniques.own_keys import technique_options
from memfit.techniques.specs.spec import TechniqueOptions, TechniqueSpec

NAME = "chunked loss"


@dataclass(frozen=True)
class ChunkedLossOptions:
    loss_chunk_tokens: int = doc(
        "Tokens whose logits exist at once (forward and backward), with "
        "memory.chunked_loss.",
        limits=(1, MAX_TOKENS), default=1024)


def chunk_tokens(memory: MemoryConfig) -> int | None:
    """Tokens per chunk of the loss with memory.chunked_loss; None without it."""
    if not memory.chunked_loss:
        return None
    return technique_options(ChunkedLossOptions, memory, NAME).loss_chunk_tokens


def check_applied(model: nn.Module, options: TechniqueOptions) -> list[str]:
    chunked_loss.check_supported(model)
    return []


SPEC = TechniqueSpec(
    name=NAME,
    docs_row="chunked LM loss (no full fp32 logits)",
    keys=("memory.chunked_loss", "memory.loss_chunk_tokens"), own=ChunkedLossOptions,
    stage="step", enabled=lambda options: options.memory.chunked_loss,
    plan="techniques.training_loss, traced as training runs it (plan.workload)",
    check_applied=check_applied, row_reset=("memory.chunked_loss",), level="+ckpt",
    ignored=(Rule(("memory.loss_chunk_tokens",), lambda c: not c.memory.chunked_loss,
                  lambda c: "it applies with memory.chunked_loss=true"),))
