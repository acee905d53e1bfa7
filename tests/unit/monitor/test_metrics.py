"""metrics.jsonl is strict JSON, survives a record cut short by a kill, and is cut back
to a checkpoint's step when a run resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.monitor.metrics import MetricsLogger, read_metrics, strict_json, truncate_metrics


def strict_loads(text: str):
    def refuse(constant: str):
        raise AssertionError(f"bare {constant} in JSON")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_written_as_null(tmp_path: Path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log({"step": 3, "loss": float("nan"), "grad_norm": float("inf"), "lr": 0.1})
    logger.close()
    record = strict_loads((tmp_path / "metrics.jsonl").read_text())
    assert record == {"step": 3, "loss": None, "grad_norm": None, "lr": 0.1}
    nested = strict_loads(strict_json({"a": [1.0, float("-inf")], "b": {"c": float("nan")}}))
    assert nested == {"a": [1.0, None], "b": {"c": None}}


def test_a_record_cut_short_is_ignored(tmp_path: Path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 2.0}]


@pytest.mark.parametrize("tensorboard", [False, True])
def test_resuming_cuts_the_records_back_to_the_checkpoint(tmp_path: Path, tensorboard: bool):
    logger = MetricsLogger(tmp_path, tensorboard=tensorboard)
    for step in range(0, 6):
        logger.log({"step": step, "loss": float(step)})
    logger.close()
    (tmp_path / "metrics.jsonl").open("a").write('{"step": 6, "lo')  # killed mid-write

    resumed = MetricsLogger(tmp_path, tensorboard=tensorboard, resume_from_step=3)
    resumed.log({"step": 4, "loss": 40.0})
    resumed.close()
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_truncating_to_minus_one_keeps_nothing(tmp_path: Path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval_loss": 1.0}\n')
    truncate_metrics(tmp_path, -1)
    assert read_metrics(tmp_path) == []


@pytest.mark.parametrize("line", ["garbage", "[1, 2]", '{"loss": 1.0}'])
def test_a_line_changed_by_something_else_is_one_line_naming_it(tmp_path: Path, line: str):
    from memfit._utils.errors import ConfigError

    (tmp_path / "metrics.jsonl").write_text(f'{{"step": 1, "loss": 2.0}}\n{line}\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl line 2 is not a metrics record"):
        read_metrics(tmp_path)
