"""Checkpoints through the CLI: a planted pickle never runs, damaged state is never trained
on (resume falls back to the newest intact checkpoint, and then equals an uninterrupted
run), a killed save's leftovers go, pruning leaves the user's folders alone, and BatchNorm
statistics survive a resume."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_line_error, run_in_process, tree_digest, write_config
from factories import write_regression_data
from safetensors.torch import load_file

from memfit.monitor.metrics import losses_by_step, read_metrics


class Plant:
    """Unpickling it creates ``marker``: proof that a file from the run folder ran code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _config(root: Path, name: str, factory: str = "factories:regressor") -> Path:
    data = root / "regression.npz"
    if not data.exists():
        write_regression_data(data)
    return write_config(root / f"{name}.yaml", {
        "model": {"factory": factory, "task": "custom"},
        "data": {"path": str(data), "format": "tensors", "eval_fraction": 0.25},
        "train": {"max_steps": 6, "micro_batch_size": 4, "save_every": 3, "eval_every": 3,
                  "output_dir": str(root / name)},
        "optimizer": {"lr": 1e-2}, "log": {"progress": False, "tensorboard": False}})


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted 6-step run with checkpoints at steps 3 and 6."""
    root = tmp_path_factory.mktemp("checkpoints")
    result = run_in_process("train", str(_config(root, "reference")), cwd=root)
    assert result.returncode == 0, result.stderr
    return root / "reference"


def _copy(reference: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(reference, run_dir)
    return run_dir


def _assert_same_run(run_dir: Path, reference: Path) -> None:
    for key in ("loss", "eval_loss"):
        assert losses_by_step(read_metrics(run_dir), key) == pytest.approx(
            losses_by_step(read_metrics(reference), key), rel=1e-6)
    final, again = (load_file(run / "model" / "model.safetensors") for run in (reference, run_dir))
    assert again.keys() == final.keys()
    for name in final:
        torch.testing.assert_close(again[name], final[name], rtol=1e-6, atol=1e-7)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_planted_metadata_pickle_never_runs_on_resume(reference: Path, tmp_path: Path):
    """Today's resume read any checkpoint holding a .metadata through DCP's pickle."""
    run_dir, marker = _copy(reference, tmp_path), tmp_path / "ran"
    step_6 = run_dir / "checkpoints" / "step-6"
    (step_6 / ".metadata").write_bytes(pickle.dumps(Plant(marker)))
    result = run_in_process("train", "--trust-code", "--resume", str(run_dir), cwd=tmp_path)
    assert not marker.exists()
    assert result.returncode == 0, result.stderr
    assert (f"memfit: warning: {step_6} is damaged (.metadata: not listed in manifest.json); "
            f"falling back to {run_dir / 'checkpoints' / 'step-3'}") in result.stderr
    _assert_same_run(run_dir, reference)


@pytest.mark.parametrize("name, damage, reason", [
    ("trainable.safetensors", _truncate, "bytes, manifest.json says"),
    ("optimizer.pt", _flip_a_byte, "its SHA-256 differs from manifest.json"),
])
def test_damaged_newest_checkpoint_falls_back_and_matches_uninterrupted(
        reference: Path, tmp_path: Path, name: str, damage, reason: str):
    run_dir = _copy(reference, tmp_path)
    damage(run_dir / "checkpoints" / "step-6" / name)
    result = run_in_process("train", "--trust-code", "--resume", str(run_dir), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "is damaged" in line]
    assert len(warnings) == 1 and f"step-6 is damaged ({name}: " in warnings[0]
    assert reason in warnings[0] and warnings[0].endswith("falling back to "
                                                          f"{run_dir / 'checkpoints' / 'step-3'}")
    _assert_same_run(run_dir, reference)


def test_no_intact_checkpoint_is_one_line_and_touches_nothing(reference: Path,
                                                               tmp_path: Path):
    run_dir = _copy(reference, tmp_path)
    _truncate(run_dir / "checkpoints" / "step-3" / "optimizer.pt")
    _flip_a_byte(run_dir / "checkpoints" / "step-6" / "trainable.safetensors")
    before = tree_digest(run_dir)
    result = run_in_process("train", "--trust-code", "--resume", str(run_dir), cwd=tmp_path)
    assert_one_line_error(result, 2, "no intact checkpoint under", "step-6: trainable",
                          "step-3: optimizer.pt")
    assert tree_digest(run_dir) == before


def test_a_killed_saves_staging_folder_is_removed_on_resume(reference: Path, tmp_path: Path):
    run_dir = _copy(reference, tmp_path)
    checkpoints = run_dir / "checkpoints"
    shutil.rmtree(checkpoints / "step-6")
    # What a save killed mid-way leaves: the folder staged_folder had not yet renamed.
    shutil.copytree(checkpoints / "step-3", checkpoints / ".step-6.q1w2e3r4")
    (checkpoints / ".step-6.q1w2e3r4" / "optimizer.pt").unlink()
    result = run_in_process("train", "--trust-code", "--resume", str(run_dir), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in checkpoints.iterdir()) == [
        "index.json", "step-3", "step-6"]
    _assert_same_run(run_dir, reference)


def test_pruning_leaves_a_folder_the_user_put_in_checkpoints(reference: Path,
                                                             tmp_path: Path):
    run_dir = _copy(reference, tmp_path)
    users = run_dir / "checkpoints" / "step-1"
    users.mkdir()
    (users / "notes.txt").write_text("my own")
    result = run_in_process("train", "--trust-code", "--resume", str(run_dir), "train.max_steps=12",
                            "train.keep_checkpoints=1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in (run_dir / "checkpoints").iterdir()) == [
        "index.json", "step-1", "step-12"]
    assert (users / "notes.txt").read_text() == "my own"


def test_batchnorm_statistics_survive_a_resume(tmp_path: Path):
    """Eval losses and the exported model depend on BatchNorm's running statistics,
    buffers that training changes but no optimizer holds."""
    root = tmp_path
    config = _config(root, "batchnorm", factory="factories:batchnorm_regressor")
    uninterrupted = root / "batchnorm"
    assert run_in_process("train", str(config), cwd=root).returncode == 0
    reference = root / "reference"
    shutil.copytree(uninterrupted, reference)

    shutil.rmtree(uninterrupted / "checkpoints" / "step-6")
    result = run_in_process("train", "--trust-code", "--resume", str(uninterrupted), cwd=root)
    assert result.returncode == 0, result.stderr
    _assert_same_run(uninterrupted, reference)
    assert "net.1.running_mean" in load_file(uninterrupted / "model" / "model.safetensors")
