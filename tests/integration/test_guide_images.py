"""docs/guide.md, "Classify images", run block by block (guide_helpers), so the guide and
memfit cannot drift."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from guide_helpers import run_section


def test_classify_images_runs_as_the_guide_shows(tmp_path: Path):
    printed = run_section("## 6. Classify images", tmp_path)

    run_dir = tmp_path / "runs/images"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_loss"] < 0.5 * summary["first_loss"], summary
    assert summary["eval_accuracy"] >= 0.9 and "eval_macro_f1" in summary
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"]["labels"] == ["blank", "horizontal", "vertical"]  # as the script says
    predictions = [json.loads(line) for line in printed[2].splitlines()]
    assert [record["file"] for record in predictions] == [
        f"eval/vertical/{index}.png" for index in range(4)]
    assert all(record["label"] == "vertical" for record in predictions)
    assert printed[-1] == "eval/horizontal/0.png: horizontal\n"
