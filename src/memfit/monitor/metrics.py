"""Metrics sinks: ``metrics.jsonl`` (one JSON object per logged step) and TensorBoard.

Each record has ``step`` (the optimizer step, from 1; 0 for the evaluation before
training) and either training keys (``loss``, ``lr``, ``grad_norm``; for token data
``tokens`` and ``tokens_per_second``: the tokens fed to the model, prompts too, padding
not, as other tools count them, with ``padding_fraction``; ``loss_tokens`` and
``loss_tokens_per_second`` for language models: the tokens the loss averages over;
``examples`` and ``examples_per_second`` for other models; memory), evaluation keys
(``eval_loss``, ``eval_perplexity``), or ``sample_answers`` (training/sample_answers.py).

The file is strict JSON: a non-finite number (a diverged loss) is written as ``null``.
A resumed run first cuts the file (and TensorBoard, through ``purge_step``) back to its
checkpoint's step, so each step has exactly one record over the whole run.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from memfit._utils.atomic import write_text
from memfit._utils.errors import ConfigError
from memfit._utils.no_follow import open_no_follow, own_folder

METRICS_FILE = "metrics.jsonl"


def _finite_or_null(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def strict_json(mapping: dict[str, Any], indent: int | None = None) -> str:
    """JSON text with non-finite floats as null (``json.dumps`` would write bare NaN)."""
    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(item) for item in value]
        return _finite_or_null(value)

    return json.dumps(clean(mapping), indent=indent, allow_nan=False)


class MetricsLogger:
    """``resume_from_step``: the checkpoint's step when resuming (None for a new run);
    records after it, left by the interrupted segment, are dropped first."""

    def __init__(self, run_dir: Path, tensorboard: bool, resume_from_step: int | None = None):
        self.path = run_dir / METRICS_FILE
        if resume_from_step is not None:
            truncate_metrics(run_dir, resume_from_step)
        # Never through a link: appending would write into whatever file it points at.
        self._file = os.fdopen(open_no_follow(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT),
                               "a", encoding="utf-8")
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: TensorBoard hides this folder's events at or after that step.
            purge = None if resume_from_step is None else resume_from_step + 1
            events = own_folder(run_dir / "tensorboard")  # a link to a folder is refused
            self._writer = SummaryWriter(log_dir=str(events), purge_step=purge)

    def log(self, record: dict[str, Any]) -> None:
        self._file.write(strict_json(record) + "\n")
        # Flushed per record so a killed run keeps every step it logged.
        self._file.flush()
        if self._writer is not None:
            step = record["step"]
            for key, value in record.items():
                numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
                if key != "step" and numeric:
                    group = "eval" if key.startswith("eval_") else "train"
                    self._writer.add_scalar(f"{group}/{key}", value, step)
            self._writer.flush()

    def add_text(self, tag: str, text: str, step: int) -> None:
        """``text`` (markdown) under ``tag`` at ``step`` in TensorBoard, when it is on."""
        if self._writer is not None:
            self._writer.add_text(tag, text, step)
            self._writer.flush()

    def close(self) -> None:
        self._file.close()
        if self._writer is not None:
            self._writer.close()


def _parse_lines(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    if text and not text.endswith("\n"):
        lines = lines[:-1]  # a record a kill cut short
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            record = error.msg
        if not isinstance(record, dict) or "step" not in record:
            raise ConfigError(f"{path} line {number} is not a metrics record ({str(record)[:80]}); "
                              "the file was changed by something other than memfit: remove "
                              "that line")
        records.append(record)
    return records


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All complete records, in the order they were logged."""
    path = Path(run_dir) / METRICS_FILE
    return _parse_lines(path) if path.is_file() else []


def truncate_metrics(run_dir: Path, through_step: int) -> None:
    """Keep only the records of steps up to ``through_step`` (what the checkpoint a run
    resumes from had seen); rewritten atomically."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return
    kept = [record for record in read_metrics(run_dir) if record.get("step", 0) <= through_step]
    write_text(path, "".join(strict_json(record) + "\n" for record in kept))


def losses_by_step(records: list[dict[str, Any]], key: str = "loss") -> dict[int, float]:
    return {record["step"]: record[key] for record in records if key in record}
