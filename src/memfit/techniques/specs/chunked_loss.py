"""Chunked loss (memory.chunked_loss): the causal-LM loss of techniques/chunked_loss.py,
which training's objective (techniques/training_loss.py) runs."""

from __future__ import annotations

from torch import nn

from memfit.config.ignored import Rule
from memfit.techniques import chunked_loss
from memfit.techniques.specs.spec import TechniqueOptions, TechniqueSpec


def check_applied(model: nn.Module, options: TechniqueOptions) -> list[str]:
    chunked_loss.check_supported(model)
    return []


SPEC = TechniqueSpec(
    name="chunked loss",
    docs_row="chunked LM loss (no full fp32 logits)",
    keys=("memory.chunked_loss", "memory.loss_chunk_tokens"),
    stage="step", enabled=lambda options: options.memory.chunked_loss,
    plan="techniques.training_loss, traced as training runs it (plan.workload)",
    check_applied=check_applied, row_reset=("memory.chunked_loss",), level="+ckpt",
    ignored=(Rule(("memory.loss_chunk_tokens",), lambda c: not c.memory.chunked_loss,
                  lambda c: "it applies with memory.chunked_loss=true"),))
