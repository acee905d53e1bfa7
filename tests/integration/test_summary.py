"""summary.json and the plan header say what was measured, in the data's own units."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_in_process, tiny_run_arguments, write_config
from factories import write_regression_data

from memfit.monitor.metrics import read_metrics


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_a_run_with_no_measured_step_says_so(tmp_path: Path, instructions: Path):
    run = tmp_path / "run"
    result = run_in_process("train", *tiny_run_arguments(
        instructions, run, "train.max_steps=3", "log.memory_every=1000",
        "log.tensorboard=false"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = summary_of(run)
    assert summary["memory_peak_bytes"] is None
    assert "log.memory_every=1000" in summary["memory_not_measured"]
    assert "peak memory   not measured" in result.stdout


def test_a_measured_run_reports_its_training_peak(tmp_path: Path, instructions: Path):
    run = tmp_path / "run"
    result = run_in_process("train", *tiny_run_arguments(
        instructions, run, "train.max_steps=2", "log.tensorboard=false"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    measured = {r["step"]: r["memory_peak_bytes"] for r in read_metrics(run)
                if "memory_peak_bytes" in r}
    peaks = list(measured.values())
    summary = summary_of(run)
    assert sorted(measured) == [1, 2]  # log.memory_every=auto: the first 2 steps on CPU
    assert summary["memory_peak_bytes"] == max(peaks)
    assert summary["memory_peak_step"] == max(measured, key=measured.get)
    assert summary["memory_measured_steps"] == 2
    assert sum(summary["memory_peak_by_category"].values()) == max(peaks)
    steps = [r for r in read_metrics(run) if "loss" in r]
    for name in ("tokens", "loss_tokens"):  # fed to the model / in the loss
        assert summary[name] == sum(r[name] for r in steps)
        assert summary[f"{name}_per_second"] == pytest.approx(
            summary[name] / summary["train_seconds"])
    assert summary["tokens"] > summary["loss_tokens"]  # the prompts are fed, not learned
    assert (f"throughput    {summary['tokens_per_second']:,.0f} tokens/s fed to the model "
            "(prompts too, padding not); "
            f"{summary['loss_tokens_per_second']:,.0f} loss tokens/s") in result.stdout


def test_data_without_tokens_counts_examples(tmp_path: Path):
    data = write_regression_data(tmp_path / "rows.npz")
    run = tmp_path / "run"
    config = write_config(tmp_path / "run.yaml", {
        "model": {"factory": "factories:regressor", "task": "custom"},
        "data": {"path": str(data), "format": "tensors", "eval_fraction": 0.25},
        "train": {"max_steps": 2, "micro_batch_size": 4, "output_dir": str(run)},
        "log": {"progress": False, "tensorboard": False}})
    result = run_in_process("train", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    steps = [r for r in read_metrics(run) if "loss" in r]
    assert all(r["examples"] == 4 and "examples_per_second" in r and "tokens" not in r
               for r in steps)
    summary = summary_of(run)
    assert summary["examples"] == 8 and "tokens" not in summary

    plan = run_in_process("plan", str(config), "--budget", "1GiB", "--device", "cpu",
                          cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "micro-batch 4 examples" in plan.stdout.splitlines()[0]


def test_a_quantized_run_counts_the_original_parameters(tmp_path: Path, instructions: Path):
    counts = {}
    for kind in ("lora", "qlora"):
        run = tmp_path / kind
        result = run_in_process("train", *tiny_run_arguments(
            instructions, run, "train.max_steps=1", f"adapter.kind={kind}",
            "log.tensorboard=false"), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        counts[kind] = summary_of(run)["total_parameters"]
    assert counts["qlora"] == counts["lora"]


def test_an_offloading_run_reports_its_host_bytes_apart(tmp_path: Path, instructions: Path):
    """On CPU the tracker's host pool holds what offload moved there: summary.json and the
    printed summary give its peak, which the device peak does not include."""
    run = tmp_path / "run"
    result = run_in_process("train", *tiny_run_arguments(
        instructions, run, "train.max_steps=2", "log.tensorboard=false",
        "memory.activation_offload=true", "memory.optimizer_offload=true"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    steps = [r for r in read_metrics(run) if "memory_peak_bytes" in r]
    summary = summary_of(run)
    assert summary["memory_host_peak_bytes"] == max(r["memory_host_peak_bytes"] for r in steps)
    # At least the offloaded activations of a step and the optimizer's host copies.
    assert all(r["memory_host_peak_bytes"] >= r["host_activation_peak_bytes"] > 0
               for r in steps)
    assert all(r["memory_host_peak_bytes"] >= r["host_optimizer_bytes"] > 0 for r in steps)
    assert summary["memory_peak_by_category"]["optimizer"] == 0
    assert "host memory" in result.stdout
