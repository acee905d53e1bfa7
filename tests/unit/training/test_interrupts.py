"""Stop requests from real signals sent to this process."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from memfit.training.interrupts import Interrupted, StopRequests


def _handlers() -> dict[int, object]:
    return {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_is_recorded_and_the_old_handlers_come_back(number):
    before = _handlers()
    with StopRequests().installed() as requests:
        os.kill(os.getpid(), number)
        os.kill(os.getpid(), signal.SIGTERM)  # a later SIGTERM changes nothing
        assert requests.received == number
    assert _handlers() == before


def test_a_second_sigint_aborts_at_once():
    with pytest.raises(KeyboardInterrupt), StopRequests().installed() as requests:
        os.kill(os.getpid(), signal.SIGTERM)
        assert requests.received == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)


def test_outside_the_main_thread_nothing_is_installed():
    seen = []

    def install():
        with StopRequests().installed():
            seen.append(_handlers())

    before = _handlers()
    thread = threading.Thread(target=install)
    thread.start()
    thread.join()
    assert seen == [before]


@pytest.mark.parametrize(("number", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_interrupted_says_where_it_stopped_and_how_to_resume(number, status):
    stopped = Interrupted(number, 7, Path("run/checkpoints/step-7"), Path("run"))
    assert stopped.exit_code == status
    assert str(stopped) == (f"stopped by {signal.Signals(number).name} after step 7; "
                            "checkpoint saved: run/checkpoints/step-7; resume with: memfit train "
                            "--resume run")
