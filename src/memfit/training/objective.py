"""The loss of one micro-batch, as a SUM with its item count, so the loop can normalise
over the whole effective batch (all tokens of all micro-batches of one optimizer step),
not average per-micro-batch means (transformers PR #34191 explains the bias that causes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from memfit.data import count_loss_tokens
from memfit.distributed import sequence_parallel
from memfit.models.loss import classification_loss_sum
from memfit.techniques.training_loss import TrainingLoss, example_count
from memfit.training.class_metrics import accuracy, confusion, macro_f1
from memfit.training.image_metrics import psnr, ssim


@dataclass(frozen=True)
class Objective(TrainingLoss):
    """Loss sum (``TrainingLoss.loss_sum``), item count and evaluation metrics for one
    micro-batch, whatever the model kind."""

    @property
    def item_name(self) -> str:
        """What ``count`` counts, as metrics and the summary name it: the tokens the loss
        averages over (``tokens`` is what the model was fed), or examples."""
        return "loss_tokens" if self.causal_lm else "examples"

    def count(self, batch: dict[str, torch.Tensor]) -> int:
        return count_loss_tokens(batch) if self.causal_lm else example_count(batch)

    def step_count(self, batch: dict[str, torch.Tensor]) -> int:
        """The items ``loss_sum`` counts in a training micro-batch: with sequence
        parallelism, this rank's slice's targets (summed over ranks: every token once)."""
        if self.causal_lm and self.sequence_group is not None:
            return sequence_parallel.target_count(batch, self.sequence_group)
        return self.count(batch)

    def eval_sums(self, model: nn.Module, batch: dict[str, torch.Tensor]
                  ) -> dict[str, torch.Tensor]:
        """Sums over the micro-batch for evaluation, which the caller adds up over the eval
        split and hands to ``eval_metrics``: ``loss``; for autoencoders ``psnr`` and
        ``ssim`` (summed per image); for classifiers ``confusion`` (class_metrics)."""
        if self.classification:
            logits = self.logits(model, batch)
            return {"loss": classification_loss_sum(logits, batch["labels"]),
                    "confusion": confusion(batch["labels"], logits)}
        if not self.reconstruction_loss:
            return {"loss": self.whole_loss_sum(model, batch)}
        loss, reconstruction, target = self.reconstruct(model, batch)
        return {"loss": loss, "psnr": psnr(reconstruction, target).sum(),
                "ssim": ssim(reconstruction, target).sum()}

    def eval_metrics(self, sums: dict[str, torch.Tensor], items: int) -> dict[str, float]:
        """The eval split's metrics from its summed ``eval_sums``: each sum's mean per item
        (``loss`` first), ``perplexity`` for language models only (exp of the mean token
        loss; it means nothing for other losses), ``accuracy`` and ``macro_f1`` for
        classifiers."""
        metrics = {name: float(total) / max(items, 1) for name, total in sums.items()
                   if name != "confusion"}
        if self.causal_lm:
            metrics["perplexity"] = math.exp(min(metrics["loss"], 50.0))
        if "confusion" in sums:
            metrics.update(accuracy=accuracy(sums["confusion"]),
                           macro_f1=macro_f1(sums["confusion"]))
        return metrics
