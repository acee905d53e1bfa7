"""Which checkpoint a run resumes from, what a killed save leaves behind, and what pruning
may delete."""

from __future__ import annotations

from pathlib import Path

import pytest

from memfit._utils.errors import CheckpointError
from memfit.checkpoint import index, newest_intact_checkpoint, remove_stale_staging
from memfit.checkpoint.manifest import CheckpointKind, write_manifest


def _checkpoint(run_dir: Path, step: int) -> Path:
    folder = run_dir / "checkpoints" / f"step-{step}"
    folder.mkdir(parents=True)
    (folder / "optimizer.pt").write_bytes(b"x" * 1620)
    write_manifest(folder, CheckpointKind.SINGLE_PROCESS, step)
    return folder


def test_no_checkpoint_at_all_is_none(tmp_path: Path):
    assert newest_intact_checkpoint(tmp_path) is None
    (tmp_path / "checkpoints").mkdir()
    assert newest_intact_checkpoint(tmp_path) is None


def test_damaged_newest_falls_back_with_one_line_each(tmp_path: Path, capsys):
    step_3 = _checkpoint(tmp_path, 3)
    (_checkpoint(tmp_path, 6) / "optimizer.pt").write_bytes(b"x" * 812)
    (_checkpoint(tmp_path, 9) / "manifest.json").unlink()
    assert newest_intact_checkpoint(tmp_path) == step_3
    lines = capsys.readouterr().err.splitlines()
    checkpoints = tmp_path / "checkpoints"
    assert lines == [
        f"memfit: warning: {checkpoints / 'step-9'} is damaged (no manifest.json); "
        f"falling back to {step_3}",
        f"memfit: warning: {checkpoints / 'step-6'} is damaged (optimizer.pt: 812 bytes, "
        f"manifest.json says 1620); falling back to {step_3}",
    ]


def test_all_damaged_is_one_line(tmp_path: Path, capsys):
    (_checkpoint(tmp_path, 3) / "optimizer.pt").write_bytes(b"")
    (_checkpoint(tmp_path, 6) / "stray.pt").write_bytes(b"")
    with pytest.raises(CheckpointError) as caught:
        newest_intact_checkpoint(tmp_path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("no intact checkpoint under")
    assert "step-6: stray.pt: not listed in manifest.json" in message
    assert "step-3: optimizer.pt: 0 bytes, manifest.json says 1620" in message
    assert capsys.readouterr().err == ""


def test_only_memfit_staging_folders_are_removed(tmp_path: Path):
    checkpoints = tmp_path / "checkpoints"
    stale = [checkpoints / ".step-6.k2_x9qzv", checkpoints / ".step-12.old.abcd1234"]
    kept = [checkpoints / ".step-6", checkpoints / "step-3", checkpoints / ".step-6.notes",
            checkpoints / ".cache"]
    for folder in stale + kept:
        folder.mkdir(parents=True)
        (folder / "file").write_text("x")
    (checkpoints / ".step-7.abcdefgh").write_text("a file with a staging name")
    assert remove_stale_staging(tmp_path) == sorted(stale)
    assert all(not folder.exists() for folder in stale)
    assert all((folder / "file").exists() for folder in kept)
    assert (checkpoints / ".step-7.abcdefgh").is_file()


def test_pruning_deletes_only_what_this_run_saved(tmp_path: Path):
    checkpoints = tmp_path / "checkpoints"
    users = checkpoints / "step-1"
    users.mkdir(parents=True)
    (users / "my-notes.txt").write_text("mine")
    for step in (2, 4, 6):
        index.claim(_checkpoint(tmp_path, step))
    index.prune(checkpoints, keep=1)
    assert sorted(path.name for path in checkpoints.iterdir()) == [
        "index.json", "step-1", "step-6"]
    assert (users / "my-notes.txt").read_text() == "mine"
    assert index.saved_by_this_run(checkpoints) == ["step-6"]


def test_a_folder_this_run_did_not_save_is_never_replaced(tmp_path: Path):
    users = tmp_path / "checkpoints" / "step-4"
    users.mkdir(parents=True)
    with pytest.raises(CheckpointError, match="was not saved by this run"):
        index.refuse_foreign(users)
    index.claim(_checkpoint(tmp_path, 2))
    index.refuse_foreign(tmp_path / "checkpoints" / "step-2")  # its own: may be re-saved


def test_an_invalid_index_is_one_line(tmp_path: Path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / "index.json").write_text('{"format": 1, "saved": ["../../home"]}')
    with pytest.raises(CheckpointError, match="is not a memfit checkpoint index"):
        index.prune(checkpoints, keep=1)
