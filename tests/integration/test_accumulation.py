"""Gradient accumulation is exact: micro-batch 4 x 1 step equals micro-batch 1 x 4
accumulation steps on variable-length data (the loss is normalised over all tokens of the
effective batch, not averaged over micro-batch means). SGD makes the weights a linear
function of the gradients, so equal gradients show as equal weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_helpers import tiny_run_arguments
from safetensors.torch import load_file

import memfit
from memfit.techniques.config_checks import load_config


def run(data: Path, output_dir: Path, micro_batch: int, accumulation: int):
    path, *overrides = tiny_run_arguments(
        data, output_dir, "train.max_steps=3", "data.eval_fraction=0",
        f"train.micro_batch_size={micro_batch}",
        f"train.gradient_accumulation_steps={accumulation}", "optimizer.name=sgd",
        "optimizer.lr=0.5", "train.lr_schedule=constant", "log.tensorboard=false")
    config = load_config(path, overrides)
    return memfit.train(config)


def test_micro_batches_accumulate_to_the_same_step(tmp_path: Path, instructions: Path):
    whole = run(instructions, tmp_path / "whole", micro_batch=4, accumulation=1)
    split = run(instructions, tmp_path / "split", micro_batch=1, accumulation=4)
    assert split.losses == pytest.approx(whole.losses, rel=1e-5)
    weights = [load_file(r.output_dir / "model" / "model.safetensors") for r in (whole, split)]
    for name in weights[0]:
        torch.testing.assert_close(weights[1][name], weights[0][name], rtol=1e-4, atol=1e-6)
