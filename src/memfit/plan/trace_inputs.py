"""``TraceInputs``: everything the planner's trace of one micro-batch reads of a run (the
model built on meta, ``meta.BuildInputs``, and the batch it runs), and nothing else.

The trace is handed only this, so it is the one list of what the trace reads, and the
trace cache's key is this object (``exact_key``: 1 and 1.0 stay apart). A key the trace
reads cannot be missing from the cache key, and the optimizer's or the loop's keys, which
it does not read, cannot split an entry: a plan's table traces each model view once.

Token batches are as long as the longest micro-batch the run will see (``token_shape``):
``data.max_length`` for packed blocks (text, or rows with data.pack); for rows padded to
the longest in each micro-batch (instruction and chat by default), the longest row among
the examples the run draws (its steps x effective batch, in the batch stream's order), read
from data.path with the model's tokenizer. Without readable data or a tokenizer, the
bound data.max_length."""

from __future__ import annotations

import functools
from collections.abc import Hashable
from dataclasses import dataclass, replace

from memfit._utils.errors import MemfitError
from memfit._utils.exact_key import exact_key
from memfit.config.schema import Config, DataConfig, DataFormat, MemoryConfig, ModelConfig
from memfit.data import build_datasets
from memfit.data.build import packing_of
from memfit.data.order import drawn, optimizer_steps
from memfit.data.tokens import Packing
from memfit.models.load import load_tokenizer
from memfit.plan.meta import BuildInputs


@dataclass(frozen=True)
class TokenShape:
    """The longest token micro-batch of a run, as the trace must build it."""

    length: int  # tokens per row of the longest micro-batch
    packing: Packing  # "none": rows padded (transformers builds a padding mask)


def token_shape(config: Config) -> TokenShape:
    """The longest micro-batch's row length and how its rows are packed (module docstring)."""
    packing = packing_of(config.data)
    rows = config.data.format in (DataFormat.TEXT, DataFormat.INSTRUCTION, DataFormat.CHAT)
    if packing != "none" or not rows or config.data.path is None:
        return TokenShape(config.data.max_length, packing)
    train = config.train
    drawn_per_step = (train.micro_batch_size * train.gradient_accumulation_steps
                      * config.distributed.nproc)
    return TokenShape(_longest_row(config.data, config.model, train.seed, train.max_steps,
                                   train.epochs, drawn_per_step), packing)


@functools.lru_cache(maxsize=8)
def _longest_row(data: DataConfig, model: ModelConfig, seed: int, max_steps: int | None,
                 epochs: float, drawn_per_step: int) -> int:
    """The longest example among those the run draws (data.order: the batch stream's
    order and count); data.max_length when the rows or the tokenizer cannot be read (a
    plan of a config.json alone, data not there yet: training would fail or say why)."""
    try:
        tokenizer = load_tokenizer(model)
        if tokenizer is None:
            return data.max_length
        train = build_datasets(data, tokenizer, seed=seed, labels=model.labels).train
    except MemfitError:
        return data.max_length
    steps = optimizer_steps(max_steps, epochs, len(train), drawn_per_step)
    return max(len(train[index]["input_ids"])
               for index in drawn(len(train), seed, steps * drawn_per_step))


@dataclass(frozen=True)
class TraceInputs:
    build: BuildInputs  # the model: its sections, data.images, the device
    micro_batch_size: int  # train.micro_batch_size
    tokens: TokenShape  # the longest token micro-batch (token_shape)
    sequence_parallel: int  # distributed.sequence_parallel: the slice of each sequence traced

    @classmethod
    def of(cls, config: Config, device: str) -> TraceInputs:
        return cls(BuildInputs.of(config, device), config.train.micro_batch_size,
                   token_shape(config), config.distributed.sequence_parallel)

    def with_memory(self, memory: MemoryConfig) -> TraceInputs:
        """The same run with other memory options (a stand-in of one kind of block)."""
        techniques = replace(self.build.techniques, memory=memory)
        return replace(self, build=replace(self.build, techniques=techniques))

    @property
    def key(self) -> Hashable:
        return exact_key(self)
