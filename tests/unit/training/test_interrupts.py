"""Stop requests from real signals sent to this process."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from memfit.training.interrupts import STOP_SIGNALS, Interrupted, StopRequests


def _handlers() -> dict[int, object]:
    return {number: signal.getsignal(number) for number in STOP_SIGNALS}


@pytest.fixture
def escaped():
    """Signals the code under test did not handle: recorded by this test's own handlers
    (which it must put back), where they would otherwise end pytest itself."""
    seen: list[int] = []
    previous = {number: signal.signal(number, lambda number, frame: seen.append(number))
                for number in STOP_SIGNALS}
    yield seen
    for number, handler in previous.items():
        signal.signal(number, handler)


@pytest.mark.parametrize("number", STOP_SIGNALS)
def test_a_signal_is_recorded_and_the_old_handlers_come_back(number, escaped):
    before = _handlers()
    with StopRequests().installed() as requests:
        os.kill(os.getpid(), number)
        os.kill(os.getpid(), signal.SIGTERM)  # a later SIGTERM changes nothing
        assert requests.received == number
    assert _handlers() == before
    assert escaped == []


def test_a_second_sigint_aborts_at_once(escaped):
    with pytest.raises(KeyboardInterrupt), StopRequests().installed() as requests:
        os.kill(os.getpid(), signal.SIGTERM)
        assert requests.received == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)


def test_a_launched_worker_waits_for_the_save_through_a_relayed_sigint(escaped):
    with StopRequests(second_sigint_aborts=False).installed() as requests:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        assert requests.received == signal.SIGINT
    assert escaped == []


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
