"""Mixed precision modes train end to end on CPU (bf16 autocast; fp16 autocast with a
gradient scaler whose state is checkpointed)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from cli_helpers import tiny_run_arguments

import memfit
from memfit.techniques.config_checks import load_config


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_modes_train_and_checkpoint(tmp_path: Path, instructions: Path, precision):
    path, *overrides = tiny_run_arguments(
        instructions, tmp_path / "run", f"precision={precision}", "train.max_steps=4",
        "optimizer.lr=3e-3", "log.tensorboard=false")
    result = memfit.train(load_config(path, overrides))
    assert all(math.isfinite(loss) for loss in result.losses.values())
    assert result.losses[4] < result.losses[1]
    scaler_file = result.output_dir / "checkpoints" / "step-4" / "scaler.pt"
    assert scaler_file.exists() == (precision == "fp16")
    if precision == "fp16":
        assert torch.load(scaler_file, weights_only=True)["scale"] > 0
