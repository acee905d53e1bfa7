"""`memfit plan` end to end: --json, and bad input (the table: tests/unit/plan)."""

from __future__ import annotations

import json

from conftest import run_cli


def test_plan_json_is_one_object(tmp_path):
    result = run_cli("plan", "model.preset=tiny-llama", "data.max_length=64",
                     "--budget", "64MiB", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert set(plan) == {"config", "strategies", "recommended", "reason"}


def test_plan_bad_budget_is_one_line_exit_2(tmp_path):
    result = run_cli("plan", "model.preset=tiny-llama", "--budget", "lots", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("memfit: error: --budget")
    assert "Traceback" not in result.stderr
