"""The loss of one micro-batch, as a SUM with its item count, so the loop can normalise
over the whole effective batch (all tokens of all micro-batches of one optimizer step),
not average per-micro-batch means (transformers PR #34191 explains the bias that causes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from memfit.data import count_loss_tokens
from memfit.models.loss import (
    causal_lm_loss_sum,
    classification_logits,
    classification_loss_sum,
    reconstruction_loss_sum,
)
from memfit.techniques import chunked_loss
from memfit.training.class_metrics import accuracy, confusion, macro_f1
from memfit.training.image_metrics import psnr, ssim


def module_loss_sum(model: nn.Module, batch: dict[str, torch.Tensor],
                    loss_function: Callable[[Any, dict], torch.Tensor] | None) -> torch.Tensor:
    """Factory models: forward(**batch) returns a mean loss (or outputs for model.loss);
    scaled by the batch size so micro-batches of different sizes weigh fairly."""
    outputs = model(**batch)
    if loss_function is not None:
        loss = loss_function(outputs, batch)
    else:
        loss = outputs if isinstance(outputs, torch.Tensor) else getattr(outputs, "loss", None)
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
        raise TypeError(
            "a model.factory model must return a scalar loss tensor (or an object with .loss) "
            "from forward(**batch), or name model.loss"
        )
    return loss * example_count(batch)


def example_count(batch: dict[str, torch.Tensor]) -> int:
    return next(iter(batch.values())).shape[0]


class Objective:
    """Loss sum and item count for one micro-batch, whatever the model kind."""

    def __init__(self, causal_lm: bool,
                 loss_function: Callable[[Any, dict], torch.Tensor] | None = None,
                 loss_chunk_tokens: int | None = None,
                 reconstruction_loss: str | None = None,
                 classification: bool = False):
        self.causal_lm = causal_lm
        # model.task=sequence-classification: mean cross-entropy per example; the batch's
        # "labels" are (B,) class ids.
        self.classification = classification
        self.loss_function = loss_function
        self.loss_chunk_tokens = loss_chunk_tokens  # memory.chunked_loss; None: unchunked
        # model.task=autoencoder: "mse" or "l1"; the batch holds "images" (the model's
        # input) and, when the target differs from it, "targets", both (B, C, H, W).
        self.reconstruction_loss = reconstruction_loss

    @property
    def item_name(self) -> str:
        """What ``count`` counts, as metrics and the summary name it."""
        return "tokens" if self.causal_lm else "examples"

    def count(self, batch: dict[str, torch.Tensor]) -> int:
        return count_loss_tokens(batch) if self.causal_lm else example_count(batch)

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.causal_lm and self.loss_chunk_tokens:
            return chunked_loss.causal_lm_loss_sum(model, batch, self.loss_chunk_tokens)
        if self.causal_lm:
            return causal_lm_loss_sum(model, batch)
        if self.reconstruction_loss:
            return self._reconstruct(model, batch)[0]
        if self.classification:
            return classification_loss_sum(classification_logits(model, batch), batch["labels"])
        return module_loss_sum(model, batch, self.loss_function)

    def eval_sums(self, model: nn.Module, batch: dict[str, torch.Tensor]
                  ) -> dict[str, torch.Tensor]:
        """Sums over the micro-batch for evaluation, which the caller adds up over the eval
        split and hands to ``eval_metrics``: ``loss``; for autoencoders ``psnr`` and
        ``ssim`` (summed per image); for classifiers ``confusion`` (class_metrics)."""
        if self.classification:
            logits = classification_logits(model, batch)
            return {"loss": classification_loss_sum(logits, batch["labels"]),
                    "confusion": confusion(batch["labels"], logits)}
        if not self.reconstruction_loss:
            return {"loss": self.loss_sum(model, batch)}
        loss, reconstruction, target = self._reconstruct(model, batch)
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

    def _reconstruct(self, model: nn.Module, batch: dict[str, torch.Tensor]
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        reconstruction = model(batch["images"])
        target = batch.get("targets", batch["images"])
        return (reconstruction_loss_sum(reconstruction, target, self.reconstruction_loss),
                reconstruction, target)
