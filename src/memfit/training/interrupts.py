"""SIGTERM and SIGINT during training: a request to stop at the next step boundary.

While ``StopRequests.installed()`` is active, the first SIGTERM or SIGINT is only recorded;
the loop finishes the step it is in, saves a checkpoint there and raises ``Interrupted``,
whose exit status is the shell's for that signal (143, 130). A second SIGINT while stopping
aborts at once (KeyboardInterrupt), for a user who will not wait for the save, except in
a launched worker: the launcher relays the signal (workers run in their own session, so
the terminal's Ctrl-C reaches only the launcher), and a second Ctrl-C ends the launcher,
which takes its workers with it (distributed.workers). Handlers can only be installed from
the main thread; elsewhere signals keep their old meaning.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from memfit._utils.errors import Stopped

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(Stopped):
    """Training stopped on a signal after saving."""

    def __init__(self, signal_number: int, step: int, checkpoint: Path, run_dir: Path):
        self.exit_code = 128 + signal_number
        super().__init__(f"stopped by {signal.Signals(signal_number).name} after step {step}; "
                         f"checkpoint saved: {checkpoint}; resume with: memfit train --resume "
                         f"{run_dir}")


class StopRequests:
    """The first stop signal received while installed (``received``; None if none)."""

    def __init__(self, second_sigint_aborts: bool = True) -> None:
        self.received: int | None = None
        self.second_sigint_aborts = second_sigint_aborts

    def _handle(self, number: int, frame: FrameType | None) -> None:
        if self.received is not None and number == signal.SIGINT and self.second_sigint_aborts:
            raise KeyboardInterrupt
        if self.received is None:
            self.received = number

    @contextmanager
    def installed(self) -> Iterator[StopRequests]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {number: signal.signal(number, self._handle) for number in STOP_SIGNALS}
        try:
            yield self
        finally:
            for number, handler in previous.items():
                # None: a handler installed outside Python, which cannot be put back as such.
                signal.signal(number, signal.SIG_DFL if handler is None else handler)
