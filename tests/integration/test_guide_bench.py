"""docs/guide.md, "Choose a strategy: plan, then measure", run block by block
(guide_helpers) as a reader would: the plan, then the bench of the same job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from guide_helpers import run_section


def test_plan_then_measure_runs_as_the_guide_shows(tmp_path: Path):
    printed = run_section("### Choose a strategy: plan, then measure", tmp_path)
    planned = {line.split()[0]: line for line in printed[1].splitlines()[3:] if line.strip()}
    assert {"lora", "lora+ckpt"} <= set(planned)
    table = (tmp_path / "bench-mine" / "bench.md").read_text()
    assert table.strip() in printed[2]
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[1:-1]]
            for line in table.splitlines() if line.startswith("| ") and "---" not in line}
    assert list(rows) == ["case", "config", "lora+ckpt"]
    header = rows["case"]
    for name in ("config", "lora+ckpt"):
        cells = dict(zip(header, rows[name], strict=True))
        assert float(cells["step ms"]) > 0 and float(cells["plan step ms"]) > 0
        assert cells["time error"].endswith("%") and cells["plan error"].endswith("%")
    results = json.loads((tmp_path / "bench-mine" / "results.json").read_text())
    for case in results["cases"]:
        assert case["note"] is None and [r["step"] for r in case["records"]] == [1, 2, 3, 4]
        measured = max(r["memory_peak_bytes"] for r in case["records"]
                       if "memory_peak_bytes" in r)
        # The CPU tracker's exact bytes: the plan is never below them.
        assert case["plan_peak_tensor_bytes"] >= measured, case["name"]
        assert case["plan_step_seconds"] > 0
    # The same batches and seed: the first step's loss is the same under both strategies,
    # up to lora+ckpt's bf16 compute (the strategy sets precision=bf16).
    first = {case["name"]: case["records"][0]["loss"] for case in results["cases"]}
    assert first["config"] == pytest.approx(first["lora+ckpt"], rel=1e-2)
    assert (tmp_path / "bench-mine" / "runs" / "lora-ckpt" / "metrics.jsonl").is_file()
