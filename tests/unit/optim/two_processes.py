"""Run a function on 2 gloo processes of this machine (torch.multiprocessing), for tests of
code that makes collectives: ``on_two_processes(check, *args)`` calls ``check(rank,
*args)`` in each process after init_process_group and fails if either raises."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, init_file: str, function: Callable, args: tuple) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=2)
    torch.set_num_threads(1)
    try:
        function(rank, *args)
    finally:
        dist.destroy_process_group()


def on_two_processes(function: Callable, *args) -> None:
    """``function`` must be importable by name (a module-level function of a test file).

    The processes are forked from multiprocessing's fork server: a fresh interpreter (not a
    fork of pytest's), started at the first call, that imports torch and ``function``'s
    module once; "spawn" paid those imports in both processes of every call."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed", __name__,
                                    function.__module__])  # read when the server starts
    with tempfile.TemporaryDirectory() as folder:
        init_file = str(Path(folder) / "init")
        mp.start_processes(_worker, args=(init_file, function, args), nprocs=2,
                           start_method="forkserver")
