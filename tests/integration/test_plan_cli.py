"""`memfit plan` end to end: --json, and bad input (the table: tests/unit/plan)."""

from __future__ import annotations

import json

from cli_helpers import run_cli


def test_plan_json_is_one_object(tmp_path):
    result = run_cli("plan", "model.preset=tiny-llama", "data.max_length=64",
                     "--budget", "64MiB", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert set(plan) == {"devices", "config", "strategies", "skipped", "recommended", "reason"}


def test_plan_bad_budget_is_one_line_exit_2(tmp_path):
    result = run_cli("plan", "model.preset=tiny-llama", "--budget", "lots", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("memfit: error: --budget")
    assert "Traceback" not in result.stderr


def test_plan_traces_a_factory_model_with_a_batch_from_its_data(tmp_path):
    from factories import write_regression_data

    write_regression_data(tmp_path / "reg.npz")
    result = run_cli("plan", "model.factory=factories:regressor", "model.task=custom",
                     "data.format=tensors", f"data.path={tmp_path / 'reg.npz'}",
                     "train.micro_batch_size=4", "--budget", "1MiB", "--device", "cpu",
                     "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    # Linear(8, 32) + Linear(32, 1): 321 fp32 parameters.
    weights = 4 * (8 * 32 + 32 + 32 + 1)
    assert plan["config"]["bytes"]["weights"] == weights
    # At AdamW's step: weights, grads and two moments are live together.
    assert plan["config"]["peak_tensor_bytes"] >= 4 * weights
