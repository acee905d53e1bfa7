"""A resumable stream of micro-batches.

The order is the concatenation of one seeded permutation per epoch, read
``micro_batch_size`` examples at a time (a micro-batch may straddle two epochs). Its whole
state is one number — examples consumed — so a resumed run reads exactly the batches an
uninterrupted run would have.

Distributed (``world_size`` > 1): each draw is one GLOBAL micro-batch of
``micro_batch_size * world_size`` examples, of which this rank collates its contiguous
``micro_batch_size``; ``consumed`` counts global examples, so N processes read what one
process with an N times larger micro-batch reads, and a checkpoint resumes on any N.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from memfit.data.order import epoch_order


class BatchStream:
    def __init__(self, dataset: Sequence, micro_batch_size: int, seed: int,
                 collate: Callable[[list], dict[str, torch.Tensor]], consumed: int = 0,
                 rank: int = 0, world_size: int = 1):
        self.dataset = dataset
        self.micro_batch_size = micro_batch_size  # per rank
        self.rank, self.world_size = rank, world_size
        self.seed = seed
        self.collate = collate
        self.consumed = consumed
        self._epoch = -1
        self._order: list[int] = []

    @property
    def epoch(self) -> float:
        return self.consumed / len(self.dataset)

    def _index(self, position: int) -> int:
        epoch, offset = divmod(position, len(self.dataset))
        if epoch != self._epoch:
            self._order = epoch_order(len(self.dataset), self.seed, epoch)
            self._epoch = epoch
        return self._order[offset]

    def next_batch(self) -> dict[str, torch.Tensor]:
        start = self.consumed + self.rank * self.micro_batch_size
        indices = [self._index(start + i) for i in range(self.micro_batch_size)]
        self.consumed += self.micro_batch_size * self.world_size
        return self.collate([self.dataset[i] for i in indices])


def eval_batches(dataset: Sequence, batch_size: int,
                 collate: Callable[[list], dict[str, torch.Tensor]], limit: int | None = None):
    """``dataset`` in order, ``batch_size`` items at a time; only its first ``limit`` items
    when given (a cap in items stays the same set when an OOM halves the batch)."""
    end = len(dataset) if limit is None else min(limit, len(dataset))
    for start in range(0, end, batch_size):
        yield collate([dataset[i] for i in range(start, min(start + batch_size, end))])
