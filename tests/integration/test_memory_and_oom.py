"""Per-step memory in metrics/summary/plot, and OOM recovery under the simulated budget:
the recovered run retries the same steps and logs the same losses as an unconstrained run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_in_process, tiny_run_arguments, write_instructions
from transformers import AutoModelForCausalLM

import memfit
from memfit.models.presets import tiny_llama
from memfit.monitor.metrics import read_metrics
from memfit.plan.ladder import KEEP_STATE
from memfit.techniques.config_checks import load_config


def train(data: Path, output_dir: Path, *overrides: str):
    # Every step measured: the peaks of all 3 steps (auto samples them on CPU).
    path, *rest = tiny_run_arguments(data, output_dir, "log.tensorboard=false",
                                     "train.max_steps=3", "optimizer.lr=1e-2",
                                     "log.memory_every=1", *overrides)
    return memfit.train(load_config(path, rest))


@pytest.fixture(scope="module")
def micro_batch_4(tmp_path_factory):
    """One finished run at micro-batch 4, trained once: read, never changed, by the tests
    that take it."""
    folder = tmp_path_factory.mktemp("micro_batch_4")
    return train(write_instructions(folder / "rows.jsonl"), folder / "run",
                 "train.micro_batch_size=4")


def test_every_step_reports_memory_by_category(micro_batch_4):
    result = micro_batch_4
    steps = [r for r in read_metrics(result.output_dir) if "loss" in r]
    parameter_bytes = 4 * result.summary["total_parameters"]
    model = AutoModelForCausalLM.from_config(tiny_llama())
    buffer_bytes = sum(b.nbytes for b in model.buffers())  # rotary inv_freq
    for record in steps:
        parts = sum(record[f"memory_{c}_bytes"] for c in
                    ("weights", "grads", "optimizer", "activations", "temporaries"))
        assert parts == record["memory_peak_bytes"]
        # fp32 weights (tied embeddings are one tensor) and buffers count as weights.
        assert record["memory_weights_bytes"] == parameter_bytes + buffer_bytes
    # AdamW holds two fp32 moments per parameter (plus one 0-d step tensor each).
    assert steps[-1]["memory_live_bytes_at_end"] >= 3 * parameter_bytes
    summary = json.loads((result.output_dir / "summary.json").read_text())
    assert summary["memory_peak_bytes"] == max(r["memory_peak_bytes"] for r in steps)
    assert (result.output_dir / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_out_of_memory_steps_down_and_matches_the_unconstrained_run(tmp_path: Path,
                                                                     instructions: Path):
    common = ["data.eval_fraction=0.2", "train.eval_every=3"]
    free = train(instructions, tmp_path / "free", "train.micro_batch_size=8", *common)
    small = train(instructions, tmp_path / "small", "train.micro_batch_size=2",
                  "train.gradient_accumulation_steps=4", *common)
    big_peak, small_peak = free.summary["memory_peak_bytes"], small.summary["memory_peak_bytes"]
    assert small_peak < big_peak
    budget = (small_peak + big_peak) // 2
    constrained = train(instructions, tmp_path / "constrained", "train.micro_batch_size=8",
                        f"memory.budget={budget}", *common)
    assert constrained.losses == pytest.approx(free.losses, rel=1e-5)
    assert constrained.eval_losses == pytest.approx(free.eval_losses, rel=1e-5)
    events = [r for r in read_metrics(constrained.output_dir) if r.get("event")]
    assert events  # the first AdamW step adds two moments: OOM comes at step 1 or 2
    # The rung planned to fit with the least predicted time, among those that keep the math
    # and the optimizer's state (plan.ladder): on this CPU's profile, offload beats halving
    # the micro-batch (twice the ops of a launch-bound tiny model).
    assert events[0]["change"].split(" ")[0] in KEEP_STATE
    assert constrained.summary["memory_peak_bytes"] <= budget
    resolved = (constrained.output_dir / "config.yaml").read_text()
    for event in events:  # resume continues with what fitted: "memory.x False -> True"
        key, _, new = event["change"].partition(" -> ")
        assert f"{key.split()[0].rpartition('.')[2]}: {new.lower()}" in resolved


def test_nothing_fits_exits_2_with_one_line(tmp_path: Path, instructions: Path):
    result = run_in_process("train", *tiny_run_arguments(instructions, tmp_path / "run",
                                                         "memory.budget=64KiB",
                                                         "train.max_steps=2"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "memory.budget=64KiB" in result.stderr and "memfit plan" in result.stderr


def test_a_rung_that_rebuilds_the_model_keeps_the_losses(tmp_path: Path, instructions: Path):
    """Micro-batch 1 cannot be split: the ladder in its order (memory.oom_rung=in_order; the
    fastest rung here, activation offload, applies live) turns on activation checkpointing,
    which rebuilds the model and carries weights, optimizer state and schedule across."""
    common = ["train.micro_batch_size=1", "data.eval_fraction=0", "memory.oom_rung=in_order"]
    free = train(instructions, tmp_path / "free", *common)
    saving = train(instructions, tmp_path / "saving", "memory.gradient_checkpointing=true",
                   *common)
    free_peak, saving_peak = (r.summary["memory_peak_bytes"] for r in (free, saving))
    assert saving_peak < free_peak
    constrained = train(instructions, tmp_path / "constrained",
                        f"memory.budget={(free_peak + saving_peak) // 2}", *common)
    assert constrained.losses == pytest.approx(free.losses, rel=1e-5)
    events = [r["change"] for r in read_metrics(constrained.output_dir) if r.get("event")]
    assert events == ["memory.gradient_checkpointing False -> True"]


def test_auto_fit_applies_the_plan_and_records_why(tmp_path: Path, instructions: Path,
                                                  micro_batch_4):
    free = micro_batch_4
    budget = int(free.summary["memory_peak_bytes"] * 0.6)
    fitted = train(instructions, tmp_path / "fitted", "train.micro_batch_size=4",
                   "memory.auto=true", f"memory.budget={budget}")
    choice = fitted.summary["auto_fit"]
    assert choice["reason"]
    # At 0.6x the measured peak the given setting cannot stay: a cheaper strategy or a
    # smaller micro-batch (with more accumulation) is chosen.
    assert (choice["strategy"] != "full-adamw"
            or choice["overrides"]["train.micro_batch_size"] < 4)
    assert fitted.summary["memory_peak_bytes"] <= budget
    resolved = (fitted.output_dir / "config.yaml").read_text()
    assert resolved.startswith(f"# memory.auto chose {choice['strategy']}")
    assert fitted.losses[3] < fitted.losses[1]


def test_train_refuses_a_preset_too_large_for_this_machine(tmp_path: Path):
    result = run_in_process("train", "model.preset=llama-2-70b", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "model.preset='llama-2-70b' needs" in result.stderr
    assert "memfit plan" in result.stderr and not (tmp_path / "runs").exists()
