"""Divergence stops the run and keeps the good state: a nan/inf loss, gradient norm or
weight ends the run with exit status 3 and one line naming the step and the last finite
checkpoint; nothing non-finite is ever saved or exported. ``train.on_nonfinite=skip``
drops such steps instead, up to ``train.max_consecutive_skips`` in a row."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_line_error, run_in_process, tree_digest, write_config
from factories import write_regression_data
from safetensors.torch import load_file

from memfit.monitor.metrics import read_metrics


def train(tmp_path: Path, name: str, factory: str, *overrides: str):
    data = tmp_path / "regression.npz"
    if not data.exists():
        write_regression_data(data)
    config = write_config(tmp_path / f"{name}.yaml", {
        "model": {"factory": f"factories:{factory}", "task": "custom"},
        "data": {"path": str(data), "format": "tensors", "eval_fraction": 0},
        "train": {"micro_batch_size": 4, "output_dir": str(tmp_path / name)},
        "optimizer": {"lr": 1e-2}, "log": {"progress": False, "tensorboard": False}})
    return run_in_process("train", str(config), *overrides, cwd=tmp_path)


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(path.name for path in run_dir.glob("checkpoints/step-*"))


def assert_saved_weights_finite(run_dir: Path) -> None:
    for path in run_dir.rglob("*.safetensors"):
        for name, tensor in load_file(path).items():
            assert torch.isfinite(tensor).all(), f"{path}: {name} is not finite"


def is_finite(value: float | None) -> bool:
    """A non-finite value is logged as null once metrics.jsonl is strict JSON, bare before."""
    return value is not None and math.isfinite(value)


def assert_no_success(run_dir: Path) -> None:
    assert not (run_dir / "summary.json").exists()
    assert not (run_dir / "model").exists()


def test_a_nan_loss_stops_the_run_and_keeps_the_last_finite_checkpoint(tmp_path: Path):
    run = tmp_path / "run"
    result = train(tmp_path, "run", "nan_at_third_step", "train.max_steps=5",
                   "train.save_every=2")
    assert_one_line_error(result, 3, "loss became nan at step 3; last finite checkpoint: "
                          f"{run}/checkpoints/step-2; lower optimizer.lr (now 0.01), or use "
                          "train.on_nonfinite=skip")
    assert checkpoints(run) == ["step-2"]
    assert_saved_weights_finite(run)
    assert_no_success(run)
    last = read_metrics(run)[-1]  # the diverged step is logged, with its non-finite loss
    assert last["step"] == 3 and not is_finite(last["loss"])


def test_layerwise_updates_stop_without_saving_what_backward_wrote(tmp_path: Path):
    """The update already ran inside backward, so the weights in memory are nan: only the
    checkpoint from before survives."""
    run = tmp_path / "run"
    result = train(tmp_path, "run", "nan_at_third_step", "optimizer.layerwise=true",
                   "train.max_steps=5", "train.save_every=2")
    line = assert_one_line_error(result, 3, "loss became nan at step 3; last finite checkpoint: "
                                 f"{run}/checkpoints/step-2")
    assert "on_nonfinite=skip" not in line
    assert checkpoints(run) == ["step-2"]
    assert_saved_weights_finite(run)
    assert_no_success(run)


def test_weights_that_overflow_under_a_finite_loss_are_never_saved(tmp_path: Path):
    """One SGD step at lr 1e38 overflows the weights it moves (lr x gradient > 3.4e38, the
    float32 maximum), yet its own loss was finite."""
    run = tmp_path / "run"
    result = train(tmp_path, "run", "regressor", "optimizer.name=sgd", "optimizer.lr=1e38",
                   "train.max_grad_norm=null", "train.max_steps=1")
    assert_one_line_error(result, 3, "weights became non-finite", "by step 1",
                          "last finite checkpoint: none was saved", "lower optimizer.lr")
    assert checkpoints(run) == []
    assert_no_success(run)
    assert is_finite(read_metrics(run)[-1]["loss"])


def test_skip_drops_the_update_of_the_nan_step(tmp_path: Path):
    """Three steps with step 3 skipped end with the weights of two steps."""
    constant = "train.lr_schedule=constant"  # the same lr at steps 1-2 whatever max_steps is
    reference = train(tmp_path, "reference", "nan_at_third_step", constant, "train.max_steps=2")
    assert reference.returncode == 0, reference.stderr
    with pytest.warns(UserWarning, match="loss became nan at step 3; its update was skipped"):
        skipped = train(tmp_path, "skipped", "nan_at_third_step", constant, "train.max_steps=3",
                        "train.on_nonfinite=skip")
    assert skipped.returncode == 0, skipped.stderr
    records = {record["step"]: record for record in read_metrics(tmp_path / "skipped")
               if "loss" in record}
    assert [(records[s]["skipped"], records[s]["skipped_steps"]) for s in (1, 2, 3)] == [
        (False, 0), (False, 0), (True, 1)]
    assert not is_finite(records[3]["loss"])
    assert_saved_weights_finite(tmp_path / "skipped")
    expected, got = (load_file(tmp_path / name / "model" / "model.safetensors")
                     for name in ("reference", "skipped"))
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0)


def test_skip_clears_galore_gradients_projected_in_backward(tmp_path: Path):
    """A nan R = P^T G left in GaLore's buffer would poison the next step's update."""
    with pytest.warns(UserWarning, match="its update was skipped"):
        result = train(tmp_path, "run", "nan_at_third_step", "optimizer.name=galore",
                       "optimizer.galore.rank=4", "optimizer.galore.projector=svd",
                       "train.max_steps=5", "train.on_nonfinite=skip")
    assert result.returncode == 0, result.stderr
    losses = [record["loss"] for record in read_metrics(tmp_path / "run") if "loss" in record]
    assert [is_finite(loss) for loss in losses] == [True, True, False, True, True]
    assert_saved_weights_finite(tmp_path / "run")


def test_too_many_skips_in_a_row_stop_the_run(tmp_path: Path):
    run = tmp_path / "run"
    with pytest.warns(UserWarning, match="its update was skipped") as skips:
        result = train(tmp_path, "run", "nan_from_second_step", "train.on_nonfinite=skip",
                       "train.max_consecutive_skips=2", "train.max_steps=6",
                       "train.save_every=1")
    assert len([w for w in skips if "its update was skipped" in str(w.message)]) == 2
    assert_one_line_error(result, 3, "loss became nan at step 4 after 2 skipped steps in a row "
                          "(train.max_consecutive_skips=2); last finite checkpoint: "
                          f"{run}/checkpoints/step-3")
    assert checkpoints(run) == ["step-2", "step-3"]
    assert_saved_weights_finite(run)
    assert_no_success(run)


@pytest.mark.parametrize(("overrides", "fragment"), [
    (["train.on_nonfinite=skip", "optimizer.layerwise=true"],
     "train.on_nonfinite=skip cannot be combined with optimizer.layerwise=true"),
    (["train.max_consecutive_skips=0"], "train.max_consecutive_skips must be at least 1, got 0"),
    (["train.on_nonfinite=ignore"], "train.on_nonfinite"),
])
def test_impossible_nonfinite_settings_are_refused(tmp_path: Path, overrides, fragment):
    write_regression_data(tmp_path / "regression.npz")
    before = tree_digest(tmp_path)
    result = train(tmp_path, "run", "regressor", *overrides)
    assert_one_line_error(result, 2, fragment)
    after = tree_digest(tmp_path)
    assert after.keys() - before.keys() == {"run.yaml"}  # the test's own config file
