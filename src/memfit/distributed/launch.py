"""``memfit train --nproc N``: start N workers on this machine with torchrun's elastic
agent (``torch.distributed.run``, run in this process), each running ``memfit train`` with
the same arguments. Workers know they were launched from torchrun's environment
(WORLD_SIZE), so ``torchrun -m memfit train ...`` (any rendezvous, any number of nodes)
works the same.

A failed job ends like a one-process run: one line and the documented exit status. The
agent's own logging and its ChildFailedError report are not shown; a worker's
``MemfitError`` comes back through ``memfit.distributed.workers`` and is printed here once
(every rank usually hits the same one), with that worker's exit status (2 bad input, 3
divergence, 130/143 a saved stop). A worker that crashed (exit 1) has printed its
traceback; one killed by a signal is named here, and the job exits 128 + that signal.
When a worker fails the agent stops the others; ``--max-restarts=0`` because a restarted
worker would not rejoin a run in progress.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memfit._utils.errors import ConfigError, MemfitError
from memfit.distributed.workers import LAUNCHER_PID, OUTCOMES_DIR, read_outcome

# What a process started by torchrun (or accelerate launch, which runs torchrun) has and
# a shell that merely kept a worker's WORLD_SIZE, RANK, MASTER_ADDR lacks.
TORCHRUN_WORKER = "TORCHELASTIC_RUN_ID"
WORKER_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _launched_world_size() -> int | None:
    # The same reading as process_group.launched_world_size, which would import torch.
    value = os.environ.get("WORLD_SIZE")
    return int(value) if value else None


def process_limit() -> tuple[int, str]:
    """The most workers ``--nproc`` starts here, and what bounds it: one per GPU (NCCL
    refuses two processes on one), else one per CPU core this process may use, and at least
    2 (more workers than cores train correctly, only slower; the bound catches typos)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count(), "one per GPU"
    # sched_getaffinity: the cores a container or `taskset` leaves (Linux); cpu_count elsewhere.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(2, cores or 1), "one per CPU core, at least 2"


def check_process_count(nproc: int, name: str) -> None:
    """Refuse ``nproc`` workers (given as ``name``) outside 1 to :func:`process_limit`."""
    most, why = process_limit()
    if not 1 <= nproc <= most:
        raise ConfigError(f"{name}: give 1 to {most} processes on this machine ({why})")


def should_launch(nproc: int) -> bool:
    """True in the process a user started with distributed.nproc (``nproc``) > 1, not in a
    worker.

    WORLD_SIZE without torchrun's TORCHELASTIC_RUN_ID is most likely left in the shell from
    a worker's environment: taken as a worker, this process would wait ten minutes for
    processes that will never join, so it is refused with what to unset.
    """
    if nproc <= 1:
        return False
    world = _launched_world_size()
    if world is None:
        check_process_count(nproc, f"distributed.nproc={nproc}")
        return True
    if TORCHRUN_WORKER in os.environ:
        return False
    present = " ".join(name for name in WORKER_VARIABLES if name in os.environ)
    raise ConfigError(f"distributed.nproc={nproc}, but this shell has WORLD_SIZE={world} "
                      "set as in a torchrun worker although torchrun did not start this "
                      f"process (no {TORCHRUN_WORKER}); to start {nproc} workers here run "
                      f"`unset {present}` first (under a launcher other than torchrun, "
                      "leave distributed.nproc at 1: WORLD_SIZE sets it)")


def worker_command() -> list[str]:
    """How a worker starts: ``python -m memfit`` without the current directory first on
    sys.path (a ``torch.py`` or ``peft.py`` lying there must not be imported, as the
    ``memfit`` script never imports it); unbuffered, so ranks' lines do not interleave."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-u", "-m", "memfit"]
    # No -P before 3.11: -c puts "" (the current directory) first; it goes before any import.
    return [sys.executable, "-u", "-c",
            "import sys; sys.path.remove(''); from memfit.cli import main; sys.exit(main())"]


@contextmanager
def _launcher_state(outcomes: Path) -> Iterator[None]:
    """The environment, signal handlers and logging the agent uses, restored afterwards
    (``memfit.cli.main`` may run in-process): workers inherit the environment, the agent
    replaces the handlers, and its logging (and torchrun's warnings) would bury the one line
    this launcher prints."""
    from torch.distributed.elastic.multiprocessing.api import _terminate_process_handler

    environment = dict(os.environ)
    os.environ.update({LAUNCHER_PID: str(os.getpid()), OUTCOMES_DIR: str(outcomes)})
    # Until the agent installs them itself (once the workers start), a stop request during
    # the rendezvous is already one the agent passes on.
    handlers = {number: signal.signal(number, _terminate_process_handler)
                for number in (signal.SIGINT, signal.SIGTERM)}
    handlers.update({number: signal.getsignal(number) for number in (signal.SIGHUP,
                                                                     signal.SIGQUIT)})
    disabled = logging.root.manager.disable  # the CLI's own quiet level, kept afterwards
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(disabled)
        for number, handler in handlers.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        os.environ.clear()
        os.environ.update(environment)


def launch(nproc: int, memfit_arguments: list[str]) -> int:
    """Run ``memfit <memfit_arguments>`` as ``nproc`` workers; the job's exit status.

    SIGTERM or SIGINT (Ctrl-C, or sent to this process alone) is passed on to the workers,
    which save at the next step boundary; this process waits for them (the agent kills a
    worker still running 30 s later) and exits as a single process does, 128 + the signal.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    arguments = parse_args(["--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
                            "--no-python", *worker_command(), *memfit_arguments])
    with tempfile.TemporaryDirectory(prefix="memfit-launch-") as folder:  # mode 0700
        outcomes = Path(folder)
        with _launcher_state(outcomes):
            try:
                run(arguments)
                return 0
            except ChildFailedError as failed:
                failures = {rank: failure.exitcode for rank, failure in failed.failures.items()}
            except SignalException as stop:
                return _stopped(stop.sigval, outcomes, nproc)
        return _failed(failures, outcomes)


def _stopped(number: int, outcomes: Path, nproc: int) -> int:
    """After a stop signal: the workers' line ("stopped by ... resume with ..."), once."""
    for rank in range(nproc):
        outcome = read_outcome(outcomes, rank)
        if outcome is not None:
            raise outcome.as_error()
    if number == signal.SIGINT:
        raise KeyboardInterrupt  # stopped before any worker trained: "memfit: interrupted"
    return 128 + number


def _failed(failures: dict[int, int], outcomes: Path) -> int:
    """The exit status of the failure that caused the others, raised with its one line.

    ``failures`` is in the agent's order: the workers it saw fail, then those it stopped
    (SIGTERM, SIGKILL 30 s later) or that failed meanwhile. A worker's own verdict (bad input,
    divergence) comes first, then a worker killed by a signal other than the agent's SIGTERM
    (the out-of-memory killer, a user's kill), as neither is caused by another worker,
    then the first other failure but one that only followed another worker's death.
    """
    relayed = {rank: outcome for rank in failures
               if (outcome := read_outcome(outcomes, rank)) is not None}
    verdicts = [rank for rank, outcome in relayed.items()
                if outcome.message is not None and not outcome.stopped]
    killed = [rank for rank, code in failures.items() if code < 0 and code != -signal.SIGTERM]
    causes = [rank for rank in failures if rank not in relayed or not relayed[rank].peer_lost]
    rank = (verdicts or killed or causes or list(failures))[0]
    code = failures[rank]
    if rank in relayed and relayed[rank].message is not None:
        raise relayed[rank].as_error()
    if code < 0:
        name = signal.Signals(-code).name
        why = " (often the kernel's out-of-memory killer: see `dmesg`)" \
            if -code == signal.SIGKILL else ""
        raise WorkerFailed(128 - code, f"worker rank {rank} was killed by {name}{why}; the "
                           "other workers were stopped; resume from the newest checkpoint "
                           "with: memfit train --resume RUN_DIR")
    # A crash's traceback, or what the worker printed before exiting (`--debug`), is above.
    raise WorkerFailed(code, f"worker rank {rank} failed with exit status {code} (its output "
                       "is above); the other workers were stopped")


class WorkerFailed(MemfitError):
    """A worker crashed or was killed: its exit status, printed as one more line."""

    def __init__(self, exit_code: int, message: str):
        super().__init__(message)
        self.exit_code = exit_code
