"""docs/guide.md, "Classify text", run block by block (guide_helpers) on a tiny BERT
standing in for the guide's bert-base-uncased/, so the guide and memfit cannot drift."""

from __future__ import annotations

import json
import re
from pathlib import Path

from guide_helpers import run_section
from tiny_bert import write_tiny_bert


def test_classify_text_runs_as_the_guide_shows(tmp_path: Path):
    write_tiny_bert(tmp_path / "bert-base-uncased")
    printed = run_section("## 5. Classify text", tmp_path)

    summary = json.loads((tmp_path / "runs/classify/summary.json").read_text())
    assert f"accuracy {summary['eval_accuracy']} macro-F1 {summary['eval_macro_f1']}\n" in printed
    config = json.loads((tmp_path / "classifier/config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    predictions = printed[-1].splitlines()
    assert len(predictions) == 2
    assert all(re.fullmatch(r"(negative|positive): .+", line) for line in predictions)
