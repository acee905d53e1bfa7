"""Metrics sinks: ``metrics.jsonl`` (one JSON object per logged step) and TensorBoard.

Each record has ``step`` (the optimizer step, from 1; 0 for the evaluation before
training) and either training keys (``loss``, ``lr``, ``grad_norm``, ``tokens_per_second``,
memory) or evaluation keys (``eval_loss``, ``eval_perplexity``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsLogger:
    def __init__(self, run_dir: Path, tensorboard: bool):
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
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

    def close(self) -> None:
        self._file.close()
        if self._writer is not None:
            self._writer.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All records; a resumed run may repeat a step, and the later record wins in use."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def losses_by_step(records: list[dict[str, Any]], key: str = "loss") -> dict[int, float]:
    return {record["step"]: record[key] for record in records if key in record}
