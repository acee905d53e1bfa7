"""Where a process's rows of a parameter lie when FSDP2 shards it along dim 0, and the two
collectives an optimizer needs to step those rows as if it held the whole tensor.

FSDP2 divides dim 0 as ``torch.chunk`` does: every process holds ceil(rows / N) rows
except the last ones, which hold what is left (possibly none). An optimizer whose update
of a row depends only on that row (AdamW, 8-bit AdamW) needs nothing of this; one that
reads the whole tensor (Adafactor's column statistics and norms, GaLore's R = P^T G and
its SVD) sums partial results with ``sum_`` or gathers the rows with ``gather``. Every
process holding a shard of the tensor must make the same calls in the same order, an
empty shard included.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


def elementwise_placement(param: torch.Tensor, value: torch.Tensor) -> int | None:
    """How the state ``value`` of an elementwise optimizer (AdamW, 8-bit AdamW) is divided
    among the processes: shaped like the parameter's rows, along dim 0 as they are; any
    other value (a step count) is whole on every process."""
    return 0 if value.dim() >= 1 and value.shape == param.shape else None


@dataclass(frozen=True)
class RowShard:
    full_shape: torch.Size  # the whole tensor's shape; the local rows are full_shape[1:]
    start: int  # index of the first row held here
    rows: int  # rows held here (0 on a process past the last chunk)
    group: dist.ProcessGroup | None = None  # None: the default group

    @staticmethod
    def of(full_shape: torch.Size | tuple[int, ...], rank: int, world_size: int,
           group: dist.ProcessGroup | None = None) -> RowShard:
        """The rows ``rank`` of ``world_size`` holds under torch.chunk's division."""
        full_shape = torch.Size(full_shape)
        chunk = -(-full_shape[0] // world_size)
        start = min(rank * chunk, full_shape[0])
        return RowShard(full_shape, start, min(chunk, full_shape[0] - start), group)

    @staticmethod
    def of_dtensor(param: torch.Tensor) -> RowShard | None:
        """The shard of an FSDP2 parameter (a DTensor sharded along dim 0 on a 1-D mesh);
        None for a plain tensor."""
        placements = getattr(param, "placements", None)
        if placements is None:
            return None
        if len(placements) != 1 or not placements[0].is_shard(0):
            raise ValueError(f"expected a parameter sharded along dim 0, got {placements}")
        mesh = param.device_mesh
        return RowShard.of(param.shape, mesh.get_local_rank(), mesh.size(),
                           mesh.get_group())

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed in place over the processes (a partial sum on each)."""
        dist.all_reduce(tensor, group=self.group)
        return tensor

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """The whole tensor from every process's rows (``local``: rows x full_shape[1:])."""
        chunk = -(-self.full_shape[0] // self.world_size)
        padded = local.new_zeros((chunk, *local.shape[1:]))
        padded[:self.rows] = local
        pieces = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(pieces, padded, group=self.group)
        return torch.cat(pieces)[:self.full_shape[0]]

    def local(self, whole: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """This process's rows of a whole tensor (along ``dim``), as a view."""
        return whole.narrow(dim, self.start, self.rows)
