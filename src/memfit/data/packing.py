"""Which rows share a block when whole rows are packed (instruction, chat; tokens.py builds
the blocks and how they keep rows apart).

Rows are placed greedily, in order, into the first block that still has room for them
(first fit; a new block when none has), each block holding at most ``capacity`` tokens.
First fit over all open blocks, not only the last one: a short row fills a gap an earlier
long row left, so blocks come out nearly full whatever the order of lengths.
"""

from __future__ import annotations

from collections.abc import Sequence


def first_fit(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """The rows (indices into ``lengths``, each at most ``capacity``) of each block, in
    order of arrival within a block; blocks in the order they were opened."""
    members: list[list[int]] = []
    room = _Room(len(lengths), capacity)
    for row, length in enumerate(lengths):
        block = room.first_with(length)
        if block == len(members):  # unopened blocks follow the opened ones
            members.append([])
        members[block].append(row)
        room.take(block, length)
    return members


class _Room:
    """Free tokens of up to ``count`` blocks (unopened ones are empty), and the first block
    with room for a row: a max segment tree over the blocks, O(log count) per row."""

    def __init__(self, count: int, capacity: int) -> None:
        self.size = 1
        while self.size < max(count, 1):
            self.size *= 2
        self.free = [capacity] * (2 * self.size)  # leaves at [size, 2 size)

    def first_with(self, tokens: int) -> int:
        node = 1
        while node < self.size:  # the left child when it has room: the first block wins
            node = 2 * node if self.free[2 * node] >= tokens else 2 * node + 1
        return node - self.size

    def take(self, block: int, tokens: int) -> None:
        node = block + self.size
        self.free[node] -= tokens
        while node > 1:
            node //= 2
            self.free[node] = max(self.free[2 * node], self.free[2 * node + 1])
