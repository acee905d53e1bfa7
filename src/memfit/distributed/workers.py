"""The worker side of ``memfit train --nproc N`` (kept free of torch: the CLI imports it).

The launcher (``memfit.distributed.launch``) gives each worker two environment variables:
its own process id, so a worker dies with it (a SIGKILLed launcher must not leave workers
training, holding the run's lock), and a private folder where a worker whose run ends in
a ``MemfitError`` (bad input, divergence, a stop on a signal) leaves that error instead of
printing it, so the launcher prints it once for all ranks with the worker's exit status.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from memfit._utils.errors import MemfitError
from memfit.training.interrupts import Interrupted

LAUNCHER_PID = "MEMFIT_LAUNCHER_PID"
OUTCOMES_DIR = "MEMFIT_LAUNCH_OUTCOMES"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass
class Outcome:
    """How a worker's run ended: its exit status and, for a ``MemfitError``, its message."""

    exit_code: int = 0
    message: str | None = None
    stopped: bool = False  # an ``Interrupted`` (a saved stop), not an error

    def as_error(self) -> MemfitError:
        """The error to raise in the launcher, so the CLI prints it as the worker would."""
        error = RelayedStop(self.message) if self.stopped else MemfitError(self.message)
        error.exit_code = self.exit_code
        return error


class RelayedStop(Interrupted):
    """A worker's ``Interrupted``, raised again in the launcher (printed without "error:")."""

    def __init__(self, message: str | None):
        MemfitError.__init__(self, message)


def outcome_path(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.json"


def read_outcome(folder: Path, rank: int) -> Outcome | None:
    """What rank ``rank`` left in ``folder`` (None when it left nothing)."""
    try:
        return Outcome(**json.loads(outcome_path(folder, rank).read_text()))
    except FileNotFoundError:
        return None


def die_with_launcher() -> None:
    """In a worker of memfit's launcher: have the kernel SIGKILL this process when the
    launcher dies (Linux); exit now if it is already gone (this process was reparented)."""
    launcher = os.environ.get(LAUNCHER_PID)
    if not launcher or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # not allowed here (a seccomp sandbox): the worker then outlives a SIGKILL
    if os.getppid() != int(launcher):  # it died before the line above took effect
        os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def relayed_to_launcher(debug: bool) -> Iterator[Outcome]:
    """Around ``memfit train`` in a worker of memfit's launcher: a ``MemfitError`` is left
    for the launcher (the outcome's ``exit_code`` is then the exit status to return)
    instead of being printed here; anywhere else, and with ``--debug`` (every rank's
    traceback), a no-op. Other exceptions are bugs and keep their traceback on every rank."""
    outcome = Outcome()
    folder = os.environ.get(OUTCOMES_DIR)
    if folder is None or "RANK" not in os.environ:
        yield outcome
        return
    die_with_launcher()
    if debug:
        yield outcome
        return
    try:
        yield outcome
    except MemfitError as error:
        outcome.exit_code, outcome.message = error.exit_code, str(error)
        outcome.stopped = isinstance(error, Interrupted)
        path = outcome_path(Path(folder), int(os.environ["RANK"]))
        # Written beside, then renamed: the launcher never reads half a file.
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(outcome.__dict__))
        partial.replace(path)
