"""`memfit bench CONFIG`: a user's own job (a Hugging Face folder, a model.factory) under
the plan's strategies, each in its own process, measured beside the plan; and its bad
input, refused in one line before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import (
    assert_one_line_error,
    regression_config,
    run_cli,
    run_in_process,
    write_config,
    write_instructions,
)


@pytest.fixture(scope="module")
def hf_job(tmp_path_factory) -> Path:
    """A config for a tiny random Llama saved as a Hugging Face folder, on instruction rows."""
    from memfit.bench.random_llama import save_random_model
    from memfit.models.presets import tiny_llama
    from memfit.models.tokenizers import byte_level_tokenizer

    folder = tmp_path_factory.mktemp("job")
    save_random_model(folder / "model", tiny_llama(), byte_level_tokenizer())
    return write_config(folder / "job.yaml", {
        "model": {"path": str(folder / "model")},
        "data": {"path": str(write_instructions(folder / "rows.jsonl")),
                 "format": "instruction", "max_length": 32},
        "adapter": {"kind": "lora", "rank": 4},
        "train": {"micro_batch_size": 2, "output_dir": str(folder / "run")}})


def test_strategies_of_a_hugging_face_folder_the_suite_builds(hf_job, tmp_path):
    """~13 s: the plan, then one strategy trained in its own process (what bench is)."""
    result = run_in_process("bench", str(hf_job), "--strategies", "config", "--steps", "2",
                            "--out", str(tmp_path / "bench"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (case,) = json.loads((tmp_path / "bench" / "results.json").read_text())["cases"]
    assert case["name"] == "config" and case["note"] is None
    assert [r["step"] for r in case["records"]] == [1, 2] and case["plan_step_seconds"] > 0
    measured = max(r["memory_peak_bytes"] for r in case["records"] if "memory_peak_bytes" in r)
    assert case["plan_peak_tensor_bytes"] >= measured  # the CPU tracker's exact bytes


def test_top_runs_the_fastest_planned_strategies_of_a_factory_model(tmp_path):
    """--top on a model.factory (the guide's test runs --strategies in the order named,
    with the same first loss)."""
    from memfit.plan.planner import load_plan_config, plan
    from memfit.training.fit import example_batch

    config = regression_config(tmp_path, tmp_path / "run")
    # A fresh process: the cases' processes import the factory from PYTHONPATH (cli_env).
    result = run_cli("bench", str(config), "--top", "2", "--steps", "3", "--out",
                     str(tmp_path / "bench"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    results = json.loads((tmp_path / "bench" / "results.json").read_text())
    # The two rows of the plan with the least predicted step time, fastest first.
    job = load_plan_config(config, [])
    planned = plan(job, device="cpu", example_batch=example_batch(job))
    fastest = sorted(planned.strategies, key=lambda row: row.time.seconds)[:2]
    assert [case["name"] for case in results["cases"]] == [row.name for row in fastest]
    for case, row in zip(results["cases"], fastest, strict=True):
        assert case["note"] is None and [r["step"] for r in case["records"]] == [1, 2, 3]
        assert case["plan_step_seconds"] == pytest.approx(row.time.seconds)
        assert case["plan_peak_tensor_bytes"] == row.estimate.peak_tensor_bytes
        assert all("memory_peak_bytes" in r for r in case["records"] if r["step"] == 2)
    assert results["device_profile"] == {"name": "cpu", "source": "calibrated"}
    assert (tmp_path / "bench" / "bench.md").read_text().strip() in result.stdout


@pytest.mark.parametrize(("arguments", "fragments"), [
    (["--strategies", "lora,turbo"], ["--strategies: 'turbo' is not a strategy of this plan",
                                      "choose from: config, full-adamw,", "lora+ckpt"]),
    (["--strategies", "lora", "--top", "2"], ["give --strategies NAMES or --top N, not both"]),
    (["--top", "0"], ["--top must be a positive integer, got 0"]),
    (["--steps", "0"], ["--steps must be a positive integer, got 0"]),
    (["--suite", "memory"], ["--suite is the suite's; CONFIG.yaml benches your own job"]),
    (["distributed.strategy=ddp", "distributed.nproc=2"],
     ["runs each strategy as one process", "distributed.nproc=1"]),
])
def test_bad_input_is_one_line_and_writes_nothing(hf_job, tmp_path, arguments, fragments):
    result = run_in_process("bench", str(hf_job), *arguments, "--out", str(tmp_path / "bench"),
                            cwd=tmp_path)
    assert_one_line_error(result, 2, *fragments)
    assert not (tmp_path / "bench").exists()


def test_a_folder_it_does_not_own_is_refused_and_left_alone(hf_job, tmp_path):
    from cli_helpers import tree_digest

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "results.json").write_text("{}")
    before = tree_digest(mine)
    result = run_in_process("bench", str(hf_job), "--top", "1", "--out", str(mine), cwd=tmp_path)
    assert_one_line_error(result, 2, "is not a memfit bench folder", "results.json")
    assert tree_digest(mine) == before
