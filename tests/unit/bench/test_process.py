"""The process-per-case runner: a result comes back from the child's file, a failure
names the child's last line, a stale result never passes for a new one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from memfit.bench.process import (
    CaseFailed,
    add_case_arguments,
    run_in_own_process,
    write_result,
)

WRITE = "from pathlib import Path; from memfit.bench.process import write_result; "


def test_the_result_the_child_wrote_comes_back(tmp_path: Path):
    result = tmp_path / "result.json"
    code = WRITE + f"print('progress noise'); write_result(Path({str(result)!r}), {{'peak': 7}})"
    assert run_in_own_process(["-c", code], result) == {"peak": 7}


def test_a_failed_case_names_its_last_line_and_keeps_its_output_in_the_log(tmp_path: Path):
    result, log = tmp_path / "result.json", tmp_path / "logs" / "case.log"
    write_result(result, {"peak": 1})  # a previous run's: must not pass for this one's
    with pytest.raises(CaseFailed) as failed:
        run_in_own_process(["-c", "print('started'); raise ValueError('boom')"], result, log)
    assert failed.value.last_line == "ValueError: boom"
    assert "Traceback" in str(failed.value)
    assert log.read_text().startswith("started\n")
    assert not result.exists()


def test_a_silent_exit_without_a_result_says_its_status(tmp_path: Path):
    with pytest.raises(CaseFailed, match=r"^exit status 3, no result$") as failed:
        run_in_own_process(["-c", "import sys; sys.exit(3)"], tmp_path / "result.json")
    assert failed.value.last_line == "exit status 3"
    with pytest.raises(CaseFailed, match="exit status 0, no result"):
        run_in_own_process(["-c", "pass"], tmp_path / "result.json")


def test_script_case_arguments_are_hidden_and_typed(capsys):
    parser = argparse.ArgumentParser()
    add_case_arguments(parser)
    arguments = parser.parse_args(["--child", "--case", "x", "--result", "r.json"])
    assert arguments.child and arguments.case == "x" and arguments.result == Path("r.json")
    assert arguments.device == "cpu"
    parser.print_help(sys.stdout)
    assert "--result" not in capsys.readouterr().out
