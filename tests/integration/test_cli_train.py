"""`memfit train` end to end on CPU through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from cli_helpers import run_cli, run_in_process, tiny_run_arguments
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from memfit.monitor.metrics import read_metrics


def test_full_fine_tune_writes_a_complete_run_folder(tmp_path: Path, instructions: Path):
    run_dir = tmp_path / "run"
    result = run_in_process("train", *tiny_run_arguments(
        instructions, run_dir, "train.max_steps=6", "train.micro_batch_size=2",
        "train.gradient_accumulation_steps=2", "train.eval_every=3", "train.save_every=2",
        "train.keep_checkpoints=2", "optimizer.lr=3e-3"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"run folder    {run_dir}/" in result.stdout

    records = read_metrics(run_dir)
    train_records = [r for r in records if "loss" in r]
    assert [r["step"] for r in train_records] == [1, 2, 3, 4, 5, 6]
    for record in train_records:
        assert {"lr", "grad_norm", "tokens_per_second", "tokens", "loss_tokens",
                "loss_tokens_per_second", "padding_fraction"} <= record.keys()
        # tokens: all the model was fed (prompts too); loss tokens: the responses only.
        assert record["tokens"] > record["loss_tokens"] and 0 <= record["padding_fraction"] < 1
        assert record["tokens_per_second"] == record["tokens"] / record["step_seconds"]
        assert record["loss_tokens_per_second"] == (record["loss_tokens"]
                                                    / record["step_seconds"])
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
    # A fresh interpreter: the stderr check below is about transformers' say-once notes,
    # which this process may have spent already.
    result = run_cli("train", *tiny_run_arguments(
        instructions, run_dir, "train.max_steps=3", "adapter.kind=lora", "adapter.rank=4",
        "adapter.targets=[q_proj, v_proj]", "memory.gradient_checkpointing=true",
        "log.tensorboard=false", "train.eval_at_start=false", "train.eval_max_batches=1"),
        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # No step-0 evaluation: only the final one, over one micro-batch of the eval split.
    evals = [r for r in read_metrics(run_dir) if "eval_loss" in r]
    assert [r["step"] for r in evals] == [3]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_loss_before"] is None and summary["eval_loss_after"] is not None
    assert "eval loss     " in result.stdout
    # A quiet CLI: memfit's lines only (its adapter map is indented below its first line);
    # transformers' "use_cache=True is incompatible with gradient checkpointing" is not.
    assert all(line.startswith(("memfit: ", "  ")) for line in result.stderr.splitlines()), (
        result.stderr)

    from peft import PeftModel, PeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    from memfit.models.presets import tiny_llama

    # What a PEFT user writes: the task type and the targets' names as a list.
    saved = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    assert saved["task_type"] == "CAUSAL_LM"
    assert sorted(saved["target_modules"]) == ["q_proj", "v_proj"]
    base = AutoModelForCausalLM.from_config(tiny_llama())
    adapted = PeftModel.from_pretrained(base, run_dir / "adapter")
    assert isinstance(adapted, PeftModelForCausalLM)  # the class AutoPeftModelForCausalLM wants
    lora_names = [name for name, _ in adapted.named_parameters() if "lora_A" in name]
    assert sorted(name.split(".lora_A")[0] for name in lora_names) == [
        f"base_model.model.model.layers.{layer}.self_attn.{leaf}"
        for layer in (0, 1) for leaf in ("q_proj", "v_proj")]
    assert summary["trainable_parameters"] < summary["total_parameters"] / 10
    # Checkpointing must not silently stop adapter gradients (transformers #26221).
    losses = [r["grad_norm"] for r in read_metrics(run_dir) if "loss" in r]
    assert all(norm > 0 for norm in losses)


def test_print_config_shows_resolved_values(tmp_path: Path):
    result = run_in_process("train", "--print-config", "train.max_steps=9", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "max_steps: 9" in result.stdout
    assert "preset: demo-base" in result.stdout
    assert not (tmp_path / "runs").exists()


def test_help_lists_every_config_key(tmp_path: Path):
    result = run_in_process("train", "--help", cwd=tmp_path)
    assert result.returncode == 0
    for key in ["model.path", "data.format", "optimizer.galore.rank", "memory.budget",
                "train.gradient_accumulation_steps", "log.every"]:
        assert key in result.stdout


def test_env_reports_backends(tmp_path: Path):
    result = run_in_process("env", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "torch" in result.stdout and "bitsandbytes 4-bit cpu" in result.stdout
    assert torch.__version__.split("+")[0] in result.stdout
