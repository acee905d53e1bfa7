"""One case in a process of its own, so that one case's allocations, caches, thread pools
and imported backends cannot change the next case's bytes or time. ``memfit bench``
(bench.runner) and the benchmarks/ scripts start their cases through here.

The child hands its result back as JSON in a file the parent names (``write_result``), not
on stdout, where progress bars and library warnings mix with it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memfit._utils.atomic import write_text
from memfit._utils.no_follow import open_no_follow

# How much of a failed case's output its error keeps: enough for a traceback.
OUTPUT_TAIL_CHARS = 3000


class CaseFailed(RuntimeError):
    """A case's process exited with an error or wrote no result; the message is the end of
    what it printed."""

    def __init__(self, output: str, exit_status: int) -> None:
        self.output, self.exit_status = output, exit_status
        super().__init__(output[-OUTPUT_TAIL_CHARS:] if output.strip()
                         else f"exit status {exit_status}, no result")

    @property
    def last_line(self) -> str:
        """The last line it printed (usually the exception), else its exit status."""
        lines = [line for line in self.output.splitlines() if line.strip()]
        return lines[-1] if lines else f"exit status {self.exit_status}"


def write_result(path: Path, result: Any) -> None:
    """Called in a case's process: hand ``result`` (JSON-able) to the parent."""
    write_text(path, json.dumps(result))


def run_in_own_process(arguments: Sequence[str], result: Path, log: Path | None = None,
                       env: Mapping[str, str] | None = None) -> Any:
    """Run ``python ARGUMENTS``, which must ``write_result(result, ...)``, and return what it
    wrote. Its stdout and stderr go to ``log`` when given; otherwise its stderr is kept
    only for the error. Raises CaseFailed."""
    result.unlink(missing_ok=True)  # a previous run's result must not pass for this one's
    # (a link there is removed itself)
    command = [sys.executable, *arguments]
    if log is None:
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        output = done.stderr
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC  # never truncating a link's target
        with os.fdopen(open_no_follow(log, flags), "w") as stream:
            done = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT, env=env,
                                  check=False)
        output = log.read_text(errors="replace")
    if done.returncode == 0 and result.is_file():
        return json.loads(result.read_text())
    raise CaseFailed(output, done.returncode)


def add_case_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a benchmarks/ script: --device, and the hidden ones its per-case child
    process is started with (see run_script_case)."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)


def run_script_case(script: str | Path, arguments: Sequence[str], result: Path) -> Any:
    """Run ``script --child --result RESULT ARGUMENTS`` (a benchmarks/ script parsing
    add_case_arguments) and return what its child wrote to ``result``."""
    return run_in_own_process([str(script), "--child", "--result", str(result), *arguments],
                              result)
