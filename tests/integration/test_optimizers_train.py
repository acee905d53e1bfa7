"""Every optimizer trains through the real loop; layer-wise updates keep gradient
accumulation exact; GaLore's projection in backward equals projecting full gradients;
GaLore (layer-wise or not) resumes exactly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import tiny_run_arguments
from safetensors.torch import load_file

import memfit
from memfit.techniques.config_checks import load_config
from memfit.training.api import RunResult


def train(data: Path, output_dir: Path, *overrides: str, resume: Path | None = None
          ) -> RunResult:
    path, *rest = tiny_run_arguments(data, output_dir, "data.eval_fraction=0",
                                     "log.tensorboard=false", *overrides)
    return memfit.train(load_config(path, rest), resume=resume)


@pytest.mark.parametrize("overrides", [
    ["optimizer.name=adamw8bit"],
    ["optimizer.name=adafactor", "optimizer.lr=1e-2"],
    ["optimizer.name=sgd", "optimizer.lr=0.5"],
    ["optimizer.name=galore", "optimizer.galore.rank=8", "optimizer.galore.projector=svd"],
    ["optimizer.name=galore", "optimizer.galore.rank=8", "optimizer.galore.projector=online"],
    ["optimizer.name=galore", "optimizer.galore.rank=8", "optimizer.galore.projector=random"],
    ["optimizer.name=galore", "optimizer.galore.rank=8", "optimizer.galore.inner=adamw8bit"],
    ["precision=bf16-pure"],
    ["precision=bf16-pure", "optimizer.name=galore", "optimizer.galore.rank=8"],
])
def test_optimizer_lowers_the_loss(tmp_path: Path, instructions: Path, overrides):
    result = train(instructions, tmp_path / "run", "train.max_steps=6", "optimizer.lr=1e-2",
                   "train.lr_schedule=constant", *overrides)
    assert result.losses[6] < result.losses[1]


@pytest.mark.parametrize("name", ["adamw", "galore"])
def test_layerwise_with_accumulation_equals_the_ordinary_loop(tmp_path: Path,
                                                              instructions: Path, name):
    # Clipping is per tensor in layer-wise mode, so it is off for the comparison; GaLore
    # takes its projector from the whole step's gradient, as the ordinary loop does.
    common = ["train.max_steps=3", "train.micro_batch_size=2",
              "train.gradient_accumulation_steps=3", "train.max_grad_norm=null",
              f"optimizer.name={name}", "optimizer.galore.rank=8",
              "optimizer.galore.update_gap=2", "optimizer.lr=1e-2",
              "optimizer.galore.layerwise_refresh=full_gradient", "optimizer.galore.projector=svd"]
    ordinary = train(instructions, tmp_path / "ordinary", *common)
    layerwise = train(instructions, tmp_path / "layerwise", *common, "optimizer.layerwise=true")
    assert layerwise.losses == pytest.approx(ordinary.losses, rel=1e-5)
    weights = [load_file(r.output_dir / "model" / "model.safetensors")
               for r in (ordinary, layerwise)]
    for key in weights[0]:
        torch.testing.assert_close(weights[1][key], weights[0][key], rtol=1e-4, atol=1e-5)


def test_galore_projected_in_backward_equals_full_gradients(tmp_path: Path,
                                                            instructions: Path):
    # update_gap 2: steps alternate between a refresh (full gradient) and R = P^T G taken
    # from backward, each accumulated over 2 micro-batches; clipping is off because it
    # counts projected weights by ||R|| (see memfit/optim/backward_projection.py).
    common = ["train.max_steps=4", "train.micro_batch_size=2",
              "train.gradient_accumulation_steps=2", "train.max_grad_norm=null",
              "optimizer.name=galore", "optimizer.galore.rank=8", "optimizer.galore.update_gap=2",
              "optimizer.lr=1e-2", "optimizer.galore.projector=randomized_svd"]
    full = train(instructions, tmp_path / "full", *common,
                 "optimizer.galore.project_in_backward=false")
    projected = train(instructions, tmp_path / "projected", *common)
    assert projected.losses == pytest.approx(full.losses, rel=1e-5)
    weights = [load_file(r.output_dir / "model" / "model.safetensors") for r in (full, projected)]
    for key in weights[0]:
        torch.testing.assert_close(weights[1][key], weights[0][key], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layerwise", ["true", "false"])
def test_galore_resumes_exactly(tmp_path: Path, instructions: Path, layerwise: str):
    settings = ["train.max_steps=6", "train.save_every=3", "train.gradient_accumulation_steps=2",
                "optimizer.name=galore", f"optimizer.layerwise={layerwise}",
                "optimizer.galore.rank=8", "optimizer.galore.update_gap=2",
                "optimizer.galore.projector=randomized_svd"]
    run_dir = tmp_path / "run"
    uninterrupted = train(instructions, run_dir, *settings)
    final = load_file(run_dir / "model" / "model.safetensors")
    shutil.rmtree(run_dir / "checkpoints" / "step-6")
    shutil.rmtree(run_dir / "model")
    resumed = memfit.train(load_config(run_dir / "config.yaml", []), resume=run_dir)
    assert {s: resumed.losses[s] for s in (4, 5, 6)} == pytest.approx(
        {s: uninterrupted.losses[s] for s in (4, 5, 6)}, rel=1e-6)
    again = load_file(run_dir / "model" / "model.safetensors")
    for key in final:
        torch.testing.assert_close(again[key], final[key], rtol=1e-6, atol=1e-7)
