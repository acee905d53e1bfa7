"""The worker side of ``memfit train --nproc N``.

The launcher (``memfit.distributed.launch``) gives each worker two environment variables:
the launcher's process id, so a worker dies with it (a SIGKILLed launcher must not leave
workers training, holding the run's lock), and a private folder where a worker whose run
ends in a ``MemfitError`` (bad input, divergence, a stop on a signal) leaves that error
instead of printing it, so the launcher prints it once for all ranks with the worker's
exit status. Each worker also leaves its process id there: a worker whose collective fails
because another one failed first (killed, crashed) says nothing, as the cause is the
other's to tell."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from memfit._utils.errors import MemfitError, Stopped

LAUNCHER_PID = "MEMFIT_LAUNCHER_PID"
OUTCOMES_DIR = "MEMFIT_LAUNCH_OUTCOMES"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Seconds a failing worker waits to learn whether another one failed first (which then
# tells the cause): far longer than a process takes to exit, short next to a job.
PEER_PATIENCE = 3.0


@dataclass
class Outcome:
    """How a worker's run ended: its exit status and, for a ``MemfitError``, its message."""

    exit_code: int = 0
    message: str | None = None
    stopped: bool = False  # a ``Stopped`` (a saved stop), not an error
    peer_lost: bool = False  # failed (quietly) after another worker had died

    def as_error(self) -> MemfitError:
        """The error to raise in the launcher, so the CLI prints it as the worker would."""
        error = (Stopped if self.stopped else MemfitError)(self.message)
        error.exit_code = self.exit_code
        return error


def outcome_path(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.json"


def _write(path: Path, text: str) -> None:
    # Written beside, then renamed: the launcher and the other workers never read half a file.
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def _is_gone(pid: int) -> bool:
    """True when process ``pid`` has exited (on Linux also while a zombie: its sockets are
    closed, which is what made a collective fail, before the launcher has reaped it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        return state in ("Z", "X")
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return True
    except OSError:
        pass
    try:  # no /proc (macOS): only an exited and reaped process counts
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        return True
    except OSError:
        return False


def _a_peer_failed_first(folder: Path, rank: int) -> bool:
    """True when a worker other than ``rank`` failed before this one: it left an outcome or
    a ``.failed`` mark, or its process is gone. A peer's crash or death is what makes this
    worker's collective fail, but the peer may still be exiting: it is waited for briefly
    (a bug of this worker's own waits as long before its traceback)."""
    deadline = time.monotonic() + PEER_PATIENCE
    while True:
        for path in folder.glob("rank-*.pid"):
            other = path.name.removesuffix(".pid")
            if other != f"rank-{rank}" and (
                    (folder / f"{other}.json").exists() or (folder / f"{other}.failed").exists()
                    or _is_gone(int(path.read_text()))):
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


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
    """Around ``memfit train`` in a worker of memfit's launcher: a ``MemfitError``, or any
    exception once another worker is gone, is left for the launcher (the outcome's
    ``exit_code`` is then the exit status to return) instead of being printed here;
    anywhere else, and with ``--debug`` (every rank's traceback), a no-op. Other exceptions
    are bugs and keep their traceback."""
    outcome = Outcome()
    folder = os.environ.get(OUTCOMES_DIR)
    if folder is None or "RANK" not in os.environ:
        yield outcome
        return
    die_with_launcher()
    if debug:
        yield outcome
        return
    rank = int(os.environ["RANK"])
    _write(Path(folder) / f"rank-{rank}.pid", str(os.getpid()))
    try:
        yield outcome
    except MemfitError as error:
        outcome.exit_code, outcome.message = error.exit_code, str(error)
        outcome.stopped = isinstance(error, Stopped)
    except Exception:
        if not _a_peer_failed_first(Path(folder), rank):
            # A bug here: its traceback, and a mark that quiets the workers it brings down.
            (Path(folder) / f"rank-{rank}.failed").touch()
            raise
        outcome.exit_code, outcome.peer_lost = 1, True
    if outcome.exit_code:
        _write(outcome_path(Path(folder), rank), json.dumps(outcome.__dict__))
