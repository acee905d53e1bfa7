"""``memfit train --nproc N``: start N workers on this machine with
``torch.distributed.run`` (torchrun), each running ``memfit train`` with the same
arguments. Workers know they were launched from torchrun's environment (WORLD_SIZE), so
``torchrun -m memfit train ...`` (any rendezvous, any number of nodes) works the same.

Failure handling is torchrun's: when a worker exits non-zero (its error printed on the
shared stderr), the others are stopped and the job exits non-zero;
``--max-restarts=0`` because a restarted worker would not rejoin a run in progress.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from memfit.config.schema import Config
from memfit.distributed.process_group import launched_world_size


def should_launch(config: Config) -> bool:
    """True in the process a user started with distributed.nproc > 1 (not in a worker)."""
    return config.distributed.nproc > 1 and launched_world_size() is None


def launch(nproc: int, memfit_arguments: list[str]) -> int:
    """Run ``python -m memfit <memfit_arguments>`` as ``nproc`` workers; their exit status.

    A stop request is the workers' to handle (they save at the next step boundary), so this
    process waits for them instead of killing torchrun: SIGTERM is passed on to torchrun,
    which passes it to the workers; Ctrl-C (SIGINT) already reaches every process of the
    terminal's group. A job stopped that way exits 128 + the signal, as a single process does.
    """
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "--max-restarts=0",
               "-m", "memfit", *memfit_arguments]
    torchrun = subprocess.Popen(command)
    received: list[int] = []

    def on_signal(number: int, frame) -> None:
        received.append(number)
        if number == signal.SIGTERM:
            torchrun.send_signal(number)

    previous = {number: signal.signal(number, on_signal)
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = torchrun.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    return 128 + received[0] if received and status != 0 else status
