"""Which loss a micro-batch trains with, and its SUM: the one dispatch training
(``training.objective``) and the planner (``plan.workload``, which traces it on fake
tensors to count the logits' memory) both run.

Chunked causal-LM loss (memory.chunked_loss), causal-LM loss, reconstruction
(model.task=autoencoder), classification (model.task=sequence-classification or
image-classification), or a
factory model's own loss (its forward's, or model.loss).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from memfit.config.schema import MemoryConfig, ModelConfig, Task
from memfit.distributed import sequence_parallel
from memfit.distributed.sequence_parallel import SequenceGroup
from memfit.models.export_module import plain_module
from memfit.models.loss import (
    causal_lm_loss_sum,
    classification_logits,
    classification_loss_sum,
    image_classification_logits,
    reconstruction_loss_sum,
)
from memfit.techniques import chunked_loss
from memfit.techniques.specs.chunked_loss import chunk_tokens

LossFunction = Callable[[Any, dict], torch.Tensor]


@dataclass(frozen=True)
class TrainingLoss:
    causal_lm: bool
    loss_function: LossFunction | None = None  # model.loss, for a factory model
    loss_chunk_tokens: int | None = None  # memory.chunked_loss; None: unchunked
    # model.task=autoencoder: "mse" or "l1"; the batch holds "images" (the model's input)
    # and, when the target differs from it, "targets", both (B, C, H, W).
    reconstruction_loss: str | None = None
    # model.task=sequence-classification or image-classification: cross-entropy per
    # example; the batch's "labels" are (B,) class ids.
    classification: bool = False
    # model.task=image-classification: how the model takes the batch's "images":
    # "pixel_values" (a Hugging Face model's keyword) or "images" (forward(images)).
    image_input: str | None = None
    classes: int | None = None  # image-classification: the logits' width the data needs
    # distributed.sequence_parallel > 1 (a training run's, set by its build): each rank
    # computes the loss of its slice of every sequence; None: whole sequences.
    sequence_group: SequenceGroup | None = None

    @classmethod
    def of(cls, model: ModelConfig, memory: MemoryConfig,
           loss_function: LossFunction | None = None):
        """The loss model.task and memory.chunked_loss call for."""
        task = model.task
        images = task is Task.IMAGE_CLASSIFICATION
        return cls(causal_lm=task is Task.CAUSAL_LM, loss_function=loss_function,
                   loss_chunk_tokens=chunk_tokens(memory),
                   reconstruction_loss=model.reconstruction_loss.value
                   if task is Task.AUTOENCODER else None,
                   classification=task in (Task.SEQUENCE_CLASSIFICATION, Task.IMAGE_CLASSIFICATION),
                   image_input=("pixel_values" if model.path else "images") if images else None,
                   classes=(len(model.labels) or None) if images else None)

    def logits(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """A classifier's (batch, classes) logits for the micro-batch."""
        if self.image_input is None:
            return classification_logits(model, batch)
        return image_classification_logits(model, batch["images"],
                                           self.image_input == "pixel_values", self.classes)

    def loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The micro-batch's loss sum; with sequence parallelism, of this rank's slice."""
        if self.causal_lm and self.sequence_group is not None:
            return self.slice_loss_sum(model, batch)
        return self.whole_loss_sum(model, batch)

    def slice_loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]
                       ) -> torch.Tensor:
        """Sequence parallelism: the summed cross-entropy of this rank's slice of every
        sequence against its targets (shifted on the whole sequence), chunked or not."""
        inputs, targets = sequence_parallel.shard_batch(batch, self.sequence_group)
        if self.loss_chunk_tokens:
            return chunked_loss.through_root(model, _slice_chunked_loss_sum, inputs, targets,
                                             self.loss_chunk_tokens)
        logits = model(**inputs).logits  # [batch, L/N, vocab]; fp32 for the loss
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1),
                               ignore_index=sequence_parallel.IGNORE_INDEX, reduction="sum")

    def whole_loss_sum(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss sum of whole sequences (evaluation runs them whole on every rank)."""
        if self.causal_lm and self.loss_chunk_tokens:
            return chunked_loss.causal_lm_loss_sum(model, batch, self.loss_chunk_tokens)
        if self.causal_lm:
            return causal_lm_loss_sum(model, batch)
        if self.reconstruction_loss:
            return self.reconstruct(model, batch)[0]
        if self.classification:
            return classification_loss_sum(self.logits(model, batch), batch["labels"])
        return module_loss_sum(model, batch, self.loss_function)

    def reconstruct(self, model: nn.Module, batch: dict[str, torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss sum, reconstruction, target) of an autoencoder's micro-batch."""
        reconstruction = model(batch["images"])
        target = batch.get("targets", batch["images"])
        return (reconstruction_loss_sum(reconstruction, target, self.reconstruction_loss),
                reconstruction, target)


def module_loss_sum(model: nn.Module, batch: dict[str, torch.Tensor],
                    loss_function: LossFunction | None) -> torch.Tensor:
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


def _slice_chunked_loss_sum(model: nn.Module, inputs: dict[str, Any], targets: torch.Tensor,
                            chunk_tokens: int) -> torch.Tensor:
    """The chunked loss of a sequence-parallel slice: targets [batch, L/N] already shifted."""
    inner = plain_module(model)
    hidden = inner.get_decoder()(**inputs).last_hidden_state  # [batch, L/N, hidden]
    return chunked_loss.targets_loss_sum(hidden, targets, inner.get_output_embeddings(),
                                         chunk_tokens)
