"""Multi-process training: the process group and rank helpers, FSDP2 sharding and the
``memfit train --nproc N`` launcher (sharded checkpoints live in memfit.checkpoint). The
helpers re-exported here are no-ops when training is not distributed."""

from memfit.distributed.process_group import (
    all_reduce_sum,
    barrier,
    broadcast_from_main,
    device,
    is_distributed,
    is_main,
    rank,
    setup,
    teardown,
    world_size,
)

__all__ = ["all_reduce_sum", "barrier", "broadcast_from_main", "device", "is_distributed",
           "is_main", "rank", "setup", "teardown", "world_size"]
