"""Losses as SUMS (causal LM: over label tokens; classification and reconstruction: over
examples), shared by training and the planner (which traces them on fake tensors to count
the logits' memory)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from memfit._utils.errors import ModelError
from memfit.models.packed import causal_lm_inputs

IGNORE_INDEX = -100  # label positions excluded from the loss (prompt, padding)


def causal_lm_loss_sum(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """Summed next-token cross-entropy over label positions that are not -100 (padded rows,
    or packed blocks: models/packed.py)."""
    inputs, labels = causal_lm_inputs(model, batch)
    logits = model(**inputs).logits
    # logits: [batch, seq, vocab]; position t predicts token t+1; fp32 for the loss.
    shifted_logits = logits[:, :-1].float()
    shifted_labels = labels[:, 1:]
    return F.cross_entropy(shifted_logits.reshape(-1, shifted_logits.size(-1)),
                           shifted_labels.reshape(-1), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def reconstruction_loss_sum(reconstruction: torch.Tensor, target: torch.Tensor, kind: str
                            ) -> torch.Tensor:
    """Autoencoders: the per-image mean ``kind`` ("mse" or "l1") error, summed over the
    batch; reconstruction and target are (B, C, H, W)."""
    loss = F.mse_loss if kind == "mse" else F.l1_loss
    return loss(reconstruction.float(), target.float(), reduction="sum") / target[0].numel()


def classification_logits(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """A sequence classifier's (batch, classes) logits; the labels stay out of forward,
    whose own loss would depend on config.problem_type."""
    return model(**{name: value for name, value in batch.items() if name != "labels"}).logits


def image_classification_logits(model: nn.Module, images: torch.Tensor, pixel_values: bool,
                                classes: int | None = None) -> torch.Tensor:
    """An image classifier's (batch, classes) logits: a Hugging Face model's
    (``pixel_values=``, ``pixel_values``) output's ``.logits``, or a module's own forward
    on the images (a tensor, or an object with ``.logits``). ``classes``: how many columns
    the logits must have (a factory's module sets its own head size)."""
    output = model(pixel_values=images) if pixel_values else model(images)
    logits = output if isinstance(output, torch.Tensor) else getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2 \
            or logits.shape[0] != images.shape[0]:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(output).__name__
        raise ModelError(f"an image classifier's forward(images) must return (batch, classes) "
                        f"logits (a tensor, or an object with .logits); got {shape} for "
                        f"{images.shape[0]} images")
    if classes is not None and logits.shape[1] != classes:
        raise ModelError(f"the model gives {logits.shape[1]} logits per image, but the data has "
                        f"{classes} classes (model.labels / model.num_labels); build the head "
                        f"with {classes} outputs")
    return logits


def classification_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of (batch, classes) logits against (batch,) class ids, summed over the
    batch, in fp32."""
    return F.cross_entropy(logits.float(), labels, reduction="sum")
