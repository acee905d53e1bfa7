"""The process group and rank helpers. Every helper is a no-op (or the obvious answer)
when training is not distributed, so the single-process loop calls them unconditionally.

A run with ``distributed.strategy=ddp`` or ``fsdp`` always has a process group: from torchrun's
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``; also
what ``accelerate launch --multi_gpu`` sets, as it runs torchrun) when launched, or a
one-process group (an in-memory store, no network) otherwise, so the same sharded code path
and checkpoint format serve one process and many.
"""

from __future__ import annotations

import gc
import os
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from memfit._utils.errors import ConfigError
from memfit.config.schema import DistributedConfig, DistributedStrategy

# Collectives that wait longer than this raise instead of hanging: long enough for a
# sharded checkpoint of a large model to be written while the other ranks wait.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


def launched_world_size() -> int | None:
    """WORLD_SIZE set by torchrun (or another launcher), or None outside one."""
    value = os.environ.get("WORLD_SIZE")
    return int(value) if value else None


def _refuse_accelerate_without_workers() -> None:
    """Refuse a process that ``accelerate launch --num_processes N`` (N > 1) started alone.

    Without ``--multi_gpu`` (or a config with ``distributed_type: MULTI_GPU``) and with no
    GPU to detect, accelerate's launcher runs the command once (or under mpirun for
    ``MULTI_CPU``), setting MASTER_ADDR but no WORLD_SIZE: each such process would train
    the whole run alone, so this says how to get torchrun's workers instead.
    """
    launched_by_accelerate = "ACCELERATE_MIXED_PRECISION" in os.environ
    if launched_by_accelerate and "MASTER_ADDR" in os.environ and launched_world_size() is None:
        raise ConfigError("accelerate launch started this process without WORLD_SIZE (it "
                          "starts several workers only through torchrun); add --multi_gpu "
                          "(also on CPUs) or set distributed_type: MULTI_GPU in its config")


def setup(section: DistributedConfig) -> DistributedConfig:
    """Join (or create) the process group a ``distributed.strategy=ddp|fsdp`` run needs.
    Returns the ``distributed`` section with ``nproc`` set to the processes a launcher
    started (torchrun, accelerate) when it was left at 1, so that the run's config.yaml
    records the global batch it trains with (what a resume compares)."""
    _refuse_accelerate_without_workers()
    world = launched_world_size()
    if section.strategy is DistributedStrategy.NONE:
        if world is not None and world > 1:
            raise ConfigError(f"launched as {world} processes (WORLD_SIZE={world}) but "
                              "distributed.strategy=none; set distributed.strategy=ddp (each "
                              "process holds the whole model) or fsdp (sharded)")
        return section
    if world is None and section.nproc > 1:
        raise ConfigError(f"distributed.nproc={section.nproc}: start the processes "
                          "with `memfit train --nproc N` or torchrun; this call runs in one")
    if world is not None and section.nproc == 1:
        section = replace(section, nproc=world)
    if dist.is_initialized():
        return section
    # CPU tensors (item counts, losses) travel over gloo, CUDA ones over NCCL.
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    if world is None:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=COLLECTIVE_TIMEOUT)
    else:
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)  # env:// from torchrun
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank())
    return section


def teardown() -> None:
    if is_distributed():
        # A finished run's model and optimizer stay alive in reference cycles (FSDP's
        # states, hooks) that only the cyclic collector frees. Freed at interpreter exit
        # instead, gloo's worker threads release tensors while Python is torn down and the
        # process aborts ("terminate called without an active exception", SIGABRT, after
        # the run succeeded). Free them now, while the group still exists.
        gc.collect()
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    """Rank 0 writes logs, TensorBoard, summaries and exports; the others only compute."""
    return rank() == 0


def device() -> torch.device:
    """This process's device: its local GPU when distributed, else cuda or cpu."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", local_rank()) if is_distributed() else torch.device("cuda")


def all_reduce_sum(value: int | float) -> int | float:
    """The sum of ``value`` over all ranks (``value`` itself when not distributed)."""
    if not is_distributed():
        return value
    total = torch.tensor(value, dtype=torch.float64)
    dist.all_reduce(total)
    return int(total.item()) if isinstance(value, int) else total.item()


def broadcast_from_main(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a picklable object)."""
    if not is_distributed():
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def barrier() -> None:
    if is_distributed():
        dist.barrier()
