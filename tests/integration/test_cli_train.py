"""`memfit train` end to end on CPU through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from cli_helpers import run_cli, tiny_run_arguments
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from memfit.monitor.metrics import read_metrics


def test_full_fine_tune_writes_a_complete_run_folder(tmp_path: Path, instructions: Path):
    run_dir = tmp_path / "run"
    result = run_cli("train", *tiny_run_arguments(
        instructions, run_dir, "train.max_steps=6", "train.micro_batch_size=2",
        "train.gradient_accumulation_steps=2", "train.eval_every=3", "train.save_every=2",
        "train.keep_checkpoints=2", "optimizer.lr=3e-3"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"run folder    {run_dir}/" in result.stdout

    records = read_metrics(run_dir)
    train_records = [r for r in records if "loss" in r]
    assert [r["step"] for r in train_records] == [1, 2, 3, 4, 5, 6]
    for record in train_records:
        assert {"lr", "grad_norm", "tokens_per_second", "tokens", "input_tokens",
                "padding_fraction"} <= record.keys()
        # Rows padded to the longest of each micro-batch: some padding, never all of it.
        assert record["input_tokens"] > record["tokens"] and 0 <= record["padding_fraction"] < 1
    assert [r["step"] for r in records if "eval_loss" in r] == [0, 3, 6]

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    assert [event.step for event in events.Scalars("eval/eval_loss")] == [0, 3, 6]
    assert len(events.Scalars("train/padding_fraction")) == 6

    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "index.json", "step-4", "step-6"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["eval_loss_after"] < summary["eval_loss_before"]

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    assert AutoTokenizer.from_pretrained(run_dir / "model").pad_token_id is not None
    assert sum(p.numel() for p in model.parameters()) == summary["total_parameters"]


def test_lora_run_saves_a_peft_adapter(tmp_path: Path, instructions: Path):
    run_dir = tmp_path / "run"
    result = run_cli("train", *tiny_run_arguments(
        instructions, run_dir, "train.max_steps=3", "adapter.kind=lora", "adapter.rank=4",
        "adapter.targets=[q_proj, v_proj]", "memory.gradient_checkpointing=true",
        "log.tensorboard=false"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from memfit.models.presets import tiny_llama

    base = AutoModelForCausalLM.from_config(tiny_llama())
    adapted = PeftModel.from_pretrained(base, run_dir / "adapter")
    lora_names = [name for name, _ in adapted.named_parameters() if "lora_" in name]
    assert lora_names and all("q_proj" in n or "v_proj" in n for n in lora_names)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trainable_parameters"] < summary["total_parameters"] / 10
    # Checkpointing must not silently stop adapter gradients (transformers #26221).
    losses = [r["grad_norm"] for r in read_metrics(run_dir) if "loss" in r]
    assert all(norm > 0 for norm in losses)


def test_print_config_shows_resolved_values(tmp_path: Path):
    result = run_cli("train", "--print-config", "train.max_steps=9", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "max_steps: 9" in result.stdout
    assert "preset: demo-base" in result.stdout
    assert not (tmp_path / "runs").exists()


def test_help_lists_every_config_key(tmp_path: Path):
    result = run_cli("train", "--help", cwd=tmp_path)
    assert result.returncode == 0
    for key in ["model.path", "data.format", "optimizer.galore.rank", "memory.budget",
                "train.gradient_accumulation_steps", "log.every"]:
        assert key in result.stdout


def test_env_reports_backends(tmp_path: Path):
    result = run_cli("env", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "torch" in result.stdout and "bitsandbytes 4-bit cpu" in result.stdout
    assert torch.__version__.split("+")[0] in result.stdout
