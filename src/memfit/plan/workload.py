"""What the planner traces for one micro-batch: a batch of fake tensors shaped as training's
would be, and the loss training would compute on it (``TrainingLoss``, the same dispatch
``training.objective`` runs)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch

from memfit._utils.errors import ConfigError
from memfit.config.schema import Config, Precision, Task
from memfit.models.load import import_object
from memfit.plan.meta import MetaModel
from memfit.techniques.training_loss import TrainingLoss

ExampleBatch = dict[str, torch.Tensor]


def workload(config: Config, built: MetaModel, example_batch: ExampleBatch | None
             ) -> tuple[Callable[[], dict[str, Any]], Callable]:
    """(make_batch, loss_sum) as the training loop would run them. Hugging Face causal LMs
    and classifiers get batches of data.max_length tokens; factory and image models the
    shapes of ``example_batch``, traced through their own loss (model.loss or forward's)."""
    loss_function = import_object(config.model.loss, "model.loss") if config.model.loss else None
    loss = TrainingLoss.for_config(config, loss_function)
    size, length = config.train.micro_batch_size, config.data.max_length
    if config.model.task is Task.CAUSAL_LM and built.is_transformers:

        def make_batch() -> dict[str, Any]:
            # attention_mask None: an all-ones mask (packed text), which transformers drops.
            return {"input_ids": torch.zeros((size, length), dtype=torch.long),
                    "labels": torch.zeros((size, length), dtype=torch.long),
                    "attention_mask": None}

        def causal_lm_loss_sum(model: Any, batch: dict[str, Any]) -> torch.Tensor:
            with _rows_seen_as_single_sequences():
                return loss.loss_sum(model, batch)

        return make_batch, causal_lm_loss_sum
    if config.model.task is Task.SEQUENCE_CLASSIFICATION:

        def make_classified_batch() -> dict[str, Any]:
            # Examples as long as data.max_length allows (the longest a batch can be).
            return {"input_ids": torch.zeros((size, length), dtype=torch.long),
                    "attention_mask": torch.ones((size, length), dtype=torch.long),
                    "labels": torch.zeros(size, dtype=torch.long)}

        return make_classified_batch, loss.loss_sum
    if example_batch is None:
        raise ConfigError("planning a model.factory or image model needs one example "
                          "micro-batch: pass example_batch={name: tensor} to memfit.plan")
    pure = config.precision is Precision.BF16_PURE  # the loop casts float inputs to bf16

    def make_factory_batch() -> dict[str, Any]:
        return {name: torch.empty(tensor.shape, dtype=torch.bfloat16
                                  if pure and tensor.is_floating_point() else tensor.dtype)
                for name, tensor in example_batch.items()}

    # A factory's causal LM is planned with its own loss on the example batch, whose names
    # are the user's (training computes the causal-LM loss from input_ids and labels).
    return make_factory_batch, replace(loss, causal_lm=False, loss_chunk_tokens=None).loss_sum


@contextlib.contextmanager
def _rows_seen_as_single_sequences() -> Iterator[None]:
    """transformers as it runs on the real packed batch: one sequence per row, so no
    attention mask is built and SDPA runs with ``is_causal`` (flash / memory-efficient
    kernels, no seq x seq matrix). With no attention_mask, transformers looks for several
    sequences packed in a row from the position ids, and takes a fake tensor for a compiler
    trace whose values it cannot read (``masking_utils.is_tracing``): it then materializes a
    [batch, 1, seq, seq] mask (bool, and its float form inside SDPA: 18.75 GiB at 81,920
    tokens) that training never allocates."""
    from transformers import masking_utils

    find = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = find
