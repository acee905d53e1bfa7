"""Exports and merges keep every buffer: a network whose BatchNorm running statistics moved
in training evaluates, once exported or merged and loaded into a fresh instance of the
factory's module, to exactly the eval loss memfit logged at the end of training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_line_error, run_in_process, write_config
from factories import batchnorm_conv_net, write_shifted_images
from safetensors.torch import load_file, save_file

from memfit.checkpoint.export import BUFFERS_FILE
from memfit.config.load import read_yaml
from memfit.data import build_datasets, collate
from memfit.merge import merge_run
from memfit.techniques.config_checks import from_mapping


def train_conv_net(tmp_path: Path, *overrides: str) -> Path:
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "run.yaml", {
        "model": {"factory": "factories:batchnorm_conv_net", "task": "custom"},
        "data": {"path": str(write_shifted_images(tmp_path / "images.npz")),
                 "format": "tensors", "eval_fraction": 0.25},
        "train": {"max_steps": 4, "micro_batch_size": 8, "output_dir": str(run_dir)},
        "optimizer": {"lr": 1e-2},
        "log": {"tensorboard": False, "progress": False}})
    result = run_in_process("train", str(config), *overrides, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return run_dir


def eval_loss_of(weights: Path, run_dir: Path) -> float:
    """The mean loss over the run's eval split of a fresh factory module holding
    ``weights`` (loaded strictly), in eval mode."""
    model = batchnorm_conv_net()
    model.load_state_dict(load_file(weights), strict=True)
    assert model.features[1].running_mean.abs().max() > 1, "the statistics did not move"
    config = from_mapping(read_yaml(run_dir / "config.yaml"))
    evaluation = build_datasets(config.data, None, seed=config.train.seed).eval
    with torch.no_grad():
        return model.eval()(**collate(list(evaluation))).item()


def final_eval_loss(run_dir: Path) -> float:
    return json.loads((run_dir / "summary.json").read_text())["eval_loss_after"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA run on the conv layers (trained once; tests that change it take a copy)."""
    return train_conv_net(tmp_path_factory.mktemp("lora"), "adapter.kind=lora",
                          "adapter.rank=2", "adapter.targets=[conv]")


def test_merged_lora_run_evaluates_to_the_final_eval_loss(tmp_path: Path, lora_run: Path):
    result = run_in_process("merge", "--trust-code",
                            str(lora_run), "--out", str(tmp_path / "merged"),
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert eval_loss_of(tmp_path / "merged/model.safetensors", lora_run) == pytest.approx(
        final_eval_loss(lora_run), rel=1e-5)


def test_buffers_of_another_model_are_refused_in_one_line(tmp_path: Path, lora_run: Path):
    run_dir = Path(shutil.copytree(lora_run, tmp_path / "run"))
    save_file({"features.9.running_mean": torch.zeros(8)},
              run_dir / "adapter" / BUFFERS_FILE)
    result = run_in_process("merge", "--trust-code",
                            str(run_dir), "--out", str(tmp_path / "merged"),
                            cwd=tmp_path)
    assert_one_line_error(result, 2, f"{BUFFERS_FILE} holds 'features.9.running_mean'",
                          "no such buffer")
    assert not (tmp_path / "merged").exists()


def test_an_adapter_without_its_buffers_merges_with_a_warning(tmp_path: Path, lora_run: Path):
    run_dir = Path(shutil.copytree(lora_run, tmp_path / "run"))
    (run_dir / "adapter" / BUFFERS_FILE).unlink()
    with pytest.warns(UserWarning, match="keeps its buffers .* as built"):
        merge_run(run_dir, tmp_path / "merged", trust_code=True)
    assert (tmp_path / "merged/model.safetensors").is_file()


def test_full_fine_tune_export_evaluates_to_the_final_eval_loss(tmp_path: Path):
    run_dir = train_conv_net(tmp_path, "adapter.kind=none")
    assert eval_loss_of(run_dir / "model/model.safetensors", run_dir) == pytest.approx(
        final_eval_loss(run_dir), rel=1e-5)
