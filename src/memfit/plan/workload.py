"""What the planner traces for one micro-batch: a batch of fake tensors shaped as training's
would be, and the loss training would compute on it (``TrainingLoss``, the same dispatch
``training.objective`` runs). Token batches are as long as the longest micro-batch the run
will see (trace_inputs.token_shape)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from memfit._utils.errors import ConfigError
from memfit.config.schema import Precision, Task
from memfit.distributed import sequence_parallel
from memfit.models.load import import_object
from memfit.plan.meta import MetaModel
from memfit.plan.trace_inputs import TraceInputs
from memfit.techniques.training_loss import TrainingLoss

ExampleBatch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Workload:
    make_batch: Callable[[], dict[str, Any]]  # one micro-batch (run under the fake mode)
    loss_sum: Callable  # (model, batch) -> the loss training backpropagates
    # distributed.sequence_parallel > 1: the stand-in group whose exchanges the trace runs,
    # counting what they would send.
    exchanges: sequence_parallel.PlannedGroup | None = None


def workload(inputs: TraceInputs, built: MetaModel, example_batch: ExampleBatch | None
             ) -> Workload:
    """The micro-batch and its loss as the training loop would run them. Hugging Face
    causal LMs and classifiers get batches of ``token_shape`` tokens; factory and image
    models the shapes of ``example_batch``, traced through their own loss (model.loss or
    forward's)."""
    options = inputs.build.techniques
    model = options.model
    loss_function = import_object(model.loss, "model.loss") if model.loss else None
    loss = TrainingLoss.of(model, options.memory, loss_function)
    size, shape = inputs.micro_batch_size, inputs.tokens
    length = shape.length
    if model.task is Task.CAUSAL_LM and built.is_transformers:
        loss = _sequence_parallel(inputs.sequence_parallel, built, loss, length)
        exchanges = loss.sequence_group.group if loss.sequence_group else None

        def make_batch() -> dict[str, Any]:
            # Training's batches hold an attention mask whatever the packing (data/tokens.py),
            # alive beside input_ids and labels through the step.
            batch = {"input_ids": torch.zeros((size, length), dtype=torch.long),
                     "labels": torch.zeros((size, length), dtype=torch.long),
                     "attention_mask": torch.ones((size, length), dtype=torch.long)}
            if shape.packing == "rows":  # rows kept apart by their positions (models.packed)
                batch["position_ids"] = torch.zeros((size, length), dtype=torch.long)
            return batch

        def causal_lm_loss_sum(model: Any, batch: dict[str, Any]) -> torch.Tensor:
            if shape.packing == "rows":  # transformers builds the block mask training does
                return loss.loss_sum(model, batch)
            if shape.packing == "stream":
                # Packed text's mask is all ones, which transformers drops; a fake mask it
                # cannot read would make it build the [batch, 1, seq, seq] padding mask
                # training builds only for batches with padding. The mask stays alive in
                # ``batch`` (the caller's), as training's does.
                batch = {**batch, "attention_mask": None}
            with _rows_seen_as_single_sequences():
                return loss.loss_sum(model, batch)

        return Workload(make_batch, causal_lm_loss_sum, exchanges)
    if model.task is Task.SEQUENCE_CLASSIFICATION:

        def make_classified_batch() -> dict[str, Any]:
            return {"input_ids": torch.zeros((size, length), dtype=torch.long),
                    "attention_mask": torch.ones((size, length), dtype=torch.long),
                    "labels": torch.zeros(size, dtype=torch.long)}

        return Workload(make_classified_batch, loss.loss_sum)
    if example_batch is None:
        raise ConfigError("planning a model.factory or image model needs one example "
                          "micro-batch: pass example_batch={name: tensor} to memfit.plan")
    pure = options.precision is Precision.BF16_PURE  # the loop casts float inputs to bf16

    def make_factory_batch() -> dict[str, Any]:
        return {name: torch.empty(tensor.shape, dtype=torch.bfloat16
                                  if pure and tensor.is_floating_point() else tensor.dtype)
                for name, tensor in example_batch.items()}

    # A factory's causal LM is planned with its own loss on the example batch, whose names
    # are the user's (training computes the causal-LM loss from input_ids and labels).
    return Workload(make_factory_batch,
                    replace(loss, causal_lm=False, loss_chunk_tokens=None).loss_sum)


def _sequence_parallel(size: int, built: MetaModel, loss: TrainingLoss, length: int
                       ) -> TrainingLoss:
    """distributed.sequence_parallel > 1: one rank of a sequence group, as training runs
    it (distributed/sequence_parallel.py): the model's attention exchanges heads for tokens
    (the exchanges only allocate their outputs here), and the loss feeds it this rank's
    slice of the whole micro-batch every rank holds. A model that cannot be split raises
    ConfigError, as training would. ``size``: distributed.sequence_parallel."""
    if size == 1:
        return loss
    sequence_parallel.use_sequence_parallel_attention(built.model, size, length)
    group = sequence_parallel.SequenceGroup(sequence_parallel.PlannedGroup(size), size, 0)
    return replace(loss, sequence_group=group)


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
