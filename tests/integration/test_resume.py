"""Resume = uninterrupted: a run killed with SIGKILL and resumed logs the same losses and
ends with the same weights as a run that was never interrupted."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import cli_env, run_in_process, tiny_run_arguments, write_config
from factories import write_regression_data
from safetensors.torch import load_file

from memfit.monitor.metrics import losses_by_step, read_metrics


def regression_arguments(data: Path, output_dir: Path) -> list[str]:
    config = write_config(output_dir.parent / f"{output_dir.name}.yaml", {
        "model": {"factory": "factories:slow_regressor", "task": "custom"},
        "data": {"path": str(data), "format": "tensors", "eval_fraction": 0.25},
        "train": {"max_steps": 14, "micro_batch_size": 4, "save_every": 3, "eval_every": 5,
                  "output_dir": str(output_dir)},
        "optimizer": {"lr": 1e-2}, "log": {"progress": False}})
    return [str(config)]


def test_sigkill_then_resume_matches_uninterrupted(tmp_path: Path):
    data = write_regression_data(tmp_path / "regression.npz")
    reference = tmp_path / "reference"
    # Only the killed run needs a process of its own; the others run in this one.
    reference_run = run_in_process("train", *regression_arguments(data, reference), cwd=tmp_path)
    assert reference_run.returncode == 0, reference_run.stderr

    killed = tmp_path / "killed"
    process = subprocess.Popen(
        [sys.executable, "-m", "memfit", "train", *regression_arguments(data, killed)],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (killed / "checkpoints" / "step-6").exists():
        assert process.poll() is None and time.monotonic() < deadline, "run ended before step 6"
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (killed / "summary.json").exists(), "the kill landed after the run finished"

    resumed = run_in_process("train", "--trust-code", "--resume", str(killed), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    expected = losses_by_step(read_metrics(reference))
    assert losses_by_step(read_metrics(killed)) == pytest.approx(expected, rel=1e-6)
    assert losses_by_step(read_metrics(killed), "eval_loss") == pytest.approx(
        losses_by_step(read_metrics(reference), "eval_loss"), rel=1e-6)
    final, again = (load_file(run / "model" / "model.safetensors") for run in (reference, killed))
    for name in final:
        torch.testing.assert_close(again[name], final[name], rtol=1e-6, atol=1e-7)


def test_lora_resume_from_an_earlier_checkpoint_matches(tmp_path: Path, instructions: Path):
    """In process: LoRA with adapter dropout (RNG state matters) on the tiny Llama."""
    run_dir = tmp_path / "run"
    arguments = tiny_run_arguments(instructions, run_dir, "train.max_steps=6",
                                   "train.save_every=3", "adapter.kind=lora",
                                   "adapter.dropout=0.1", "log.tensorboard=false")
    result = run_in_process("train", *arguments, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    uninterrupted = losses_by_step(read_metrics(run_dir))
    adapter = load_file(run_dir / "adapter" / "adapter_model.safetensors")

    shutil.rmtree(run_dir / "checkpoints" / "step-6")
    (run_dir / "metrics.jsonl").write_text("")
    result = run_in_process("train", "--trust-code", "--resume", str(run_dir), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    resumed = losses_by_step(read_metrics(run_dir))
    assert sorted(resumed) == [4, 5, 6]
    assert resumed == pytest.approx({s: uninterrupted[s] for s in (4, 5, 6)}, rel=1e-6)
    again = load_file(run_dir / "adapter" / "adapter_model.safetensors")
    for name in adapter:
        torch.testing.assert_close(again[name], adapter[name], rtol=1e-6, atol=1e-7)
