"""The order training draws examples in, and how many it draws: shared by the batch stream
(``training.batches``) and the planner, which sizes a run's batches from the examples the
run will see (``plan.workload``)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch


def epoch_order(count: int, seed: int, epoch: int) -> list[int]:
    """The permutation of ``count`` examples that epoch ``epoch`` of a run seeded ``seed``
    reads."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(count, generator=generator).tolist()


def drawn(count: int, seed: int, examples: int) -> Iterator[int]:
    """The indices of the first ``examples`` examples drawn (the epochs' orders one after
    another), over all processes together."""
    for epoch in range(-(-examples // count)):
        order = epoch_order(count, seed, epoch)
        yield from order[:examples - epoch * count]


def optimizer_steps(max_steps: int | None, epochs: float, train_examples: int,
                    examples_per_step: int) -> int:
    """train.max_steps, or the number of steps whose examples come closest to train.epochs
    passes over the ``train_examples`` (at least one): the batch stream's epoch (examples
    drawn / examples) then ends as near train.epochs as whole steps allow."""
    if max_steps is not None:
        return max_steps
    return max(1, math.floor(epochs * train_examples / examples_per_step + 0.5))
