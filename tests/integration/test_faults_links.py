"""Links and look-alike folders in a run folder, as a hostile or careless user passes them
on: memfit never writes, truncates or deletes through a symbolic link, and a folder is a
run only when memfit's own marker says so. Each refusal is one line, exit 2, and the
link's target (outside the run folder) is byte-for-byte unchanged."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, regression_config, run_in_process, tree_digest

from memfit._utils.atomic import leftovers_of, visible_name, write_text
from memfit._utils.errors import ConfigError
from memfit._utils.no_follow import open_no_follow, remove_entry


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 4-step run (checkpoints at steps 2 and 4, TensorBoard on), copied per test."""
    folder = tmp_path_factory.mktemp("finished")
    run = folder / "run"
    config = regression_config(folder, run, tensorboard=True)
    result = run_in_process("train", str(config), cwd=folder)
    assert result.returncode == 0, result.stderr
    return run


def copy_run(finished: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished, run, symlinks=True)
    shutil.copy(finished.parent / "regression.npz", tmp_path / "regression.npz")
    return run


def link_outside(run: Path, name: str, tmp_path: Path) -> Path:
    """Move ``run/name`` out of the run folder and leave a link to it in its place; returns
    the target (the user's file or folder memfit must never touch)."""
    target = tmp_path / "users" / name.replace("/", "-")
    target.parent.mkdir(exist_ok=True)
    (run / name).rename(target)
    (run / name).symlink_to(target)
    return target


def resume(run: Path, tmp_path: Path, *overrides: str):
    return run_in_process("train", "--trust-code", "--resume", str(run), *overrides,
                          cwd=tmp_path)


# --- resume: every entry memfit writes, linked to a file or folder outside ---------------

@pytest.mark.parametrize("name", [".memfit.lock", "config.yaml", "metrics.jsonl", "data.json",
                                  "base.json", "summary.json", "memory.png",
                                  "checkpoints/index.json", "tensorboard", "checkpoints",
                                  "model"])
def test_resume_never_writes_through_a_link(tmp_path: Path, finished: Path, name: str):
    run = copy_run(finished, tmp_path)
    target = link_outside(run, name, tmp_path)
    before, outside = tree_digest(run), tree_digest(target.parent)
    # A longer run: it would log, write TensorBoard events, save, prune and export.
    result = resume(run, tmp_path, "train.max_steps=6", "train.keep_checkpoints=1")
    assert_one_line_error(result, 2, str(run / name), "symbolic link")
    assert tree_digest(target.parent) == outside
    assert tree_digest(run) == before


def test_the_lock_file_is_opened_without_following_a_link(tmp_path: Path):
    mine = tmp_path / "notes.txt"
    mine.write_text("years of notes")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".memfit.lock").symlink_to(mine)
    from memfit.training.run_folder import RunFolder

    with pytest.raises(ConfigError, match=r"\.memfit\.lock is a symbolic link"):
        RunFolder(tmp_path / "run")
    assert mine.read_text() == "years of notes"


def test_a_hard_linked_lock_file_is_never_truncated(tmp_path: Path, finished: Path):
    run = copy_run(finished, tmp_path)
    mine = tmp_path / "notes.txt"
    mine.write_text("years of notes")
    (run / ".memfit.lock").unlink()
    os.link(mine, run / ".memfit.lock")
    result = resume(run, tmp_path, "train.max_steps=6")
    assert_one_line_error(result, 2, str(run / ".memfit.lock"), "hard-linked")
    assert mine.read_text() == "years of notes"


def test_a_fifo_where_memfit_keeps_a_file_is_one_line(tmp_path: Path, finished: Path):
    run = copy_run(finished, tmp_path)
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")  # appending to it would block forever
    result = resume(run, tmp_path, "train.max_steps=6")
    assert_one_line_error(result, 2, str(run / "metrics.jsonl"), "a FIFO")


# --- a run that stopped before its first checkpoint starts again -------------------------

def test_a_restarted_run_removes_links_never_their_targets(tmp_path: Path, finished: Path):
    run = copy_run(finished, tmp_path)
    for name in ("checkpoints", "model", "summary.json"):  # as if killed before step 2
        remove_entry(run / name)
    folder_target = link_outside(run, "tensorboard", tmp_path)
    file_target = link_outside(run, "metrics.jsonl", tmp_path)
    (tmp_path / "users" / "checkpoints").mkdir()
    (tmp_path / "users" / "checkpoints" / "step-2").mkdir()
    (run / "checkpoints").symlink_to(tmp_path / "users" / "checkpoints")
    outside = tree_digest(tmp_path / "users")
    config = regression_config(tmp_path, run, tensorboard=True)
    result = run_in_process("train", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert tree_digest(tmp_path / "users") == outside
    assert folder_target.is_dir() and file_target.is_file()
    for name in ("tensorboard", "metrics.jsonl", "checkpoints"):
        assert not (run / name).is_symlink()
    assert (run / "checkpoints" / "step-4").is_dir()


# --- a folder is a run only with memfit's own marker -------------------------------------

def another_tools_run(tmp_path: Path) -> Path:
    """What another trainer leaves: files named like a memfit run's, no marker."""
    folder = tmp_path / "their-run"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.yaml").write_text("lr: 0.1\n")
    (folder / "metrics.jsonl").write_text('{"step": 1, "loss": 2.5}\n')
    (folder / "checkpoints" / "best.ckpt").write_bytes(b"weights")
    return folder


def test_another_tools_run_is_never_taken_for_a_memfit_run(tmp_path: Path):
    folder = another_tools_run(tmp_path)
    config = regression_config(tmp_path, folder, tensorboard=True)
    before = tree_digest(tmp_path)
    result = run_in_process("train", str(config), cwd=tmp_path)
    assert_one_line_error(result, 2, "train.output_dir", "not a memfit run folder",
                          "memfit-run.json")
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("command", ["resume", "report"])
def test_a_folder_without_the_marker_is_one_line(tmp_path: Path, finished: Path, command: str):
    run = copy_run(finished, tmp_path)
    marker = run / "memfit-run.json"
    marker.rename(tmp_path / "marker.json")
    marker.symlink_to(tmp_path / "marker.json")  # a linked marker does not count either
    before = tree_digest(tmp_path)
    arguments = (["train", "--trust-code", "--resume", str(run)] if command == "resume"
                 else ["report", str(run)])
    result = run_in_process(*arguments, cwd=tmp_path)
    assert_one_line_error(result, 2, str(run), "not a memfit run folder", "memfit-run.json")
    assert tree_digest(tmp_path) == before


def test_an_output_dir_that_is_a_link_is_refused(tmp_path: Path):
    mine = tmp_path / "mine"
    mine.mkdir()  # empty: as a plain folder it would be used
    (tmp_path / "run").symlink_to(mine)
    config = regression_config(tmp_path, tmp_path / "run", tensorboard=True)
    result = run_in_process("train", str(config), cwd=tmp_path)
    assert_one_line_error(result, 2, "train.output_dir", "symbolic link")
    assert list(mine.iterdir()) == []


def test_pruning_never_leaves_the_run_folder(tmp_path: Path, finished: Path):
    run = copy_run(finished, tmp_path)
    victim = tmp_path / "step-1"
    victim.mkdir()
    (run / "checkpoints" / "index.json").write_text(
        '{"format": 1, "saved": ["../../step-1", "step-2", "step-4"]}')
    result = resume(run, tmp_path, "train.max_steps=6", "train.keep_checkpoints=1")
    assert_one_line_error(result, 2, "index.json", "not a memfit checkpoint index")
    assert victim.is_dir()


def test_a_linked_checkpoint_is_never_loaded_or_deleted(tmp_path: Path, finished: Path):
    run = copy_run(finished, tmp_path)
    target = link_outside(run, "checkpoints/step-4", tmp_path)
    outside = tree_digest(target)
    result = resume(run, tmp_path, "train.max_steps=6", "train.keep_checkpoints=1")
    assert result.returncode == 0, result.stderr
    assert tree_digest(target) == outside
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["index.json", "step-6"]


# --- the helpers themselves ----------------------------------------------------------------

def test_write_text_refuses_a_link_and_leaves_its_target(tmp_path: Path):
    mine = tmp_path / "mine.txt"
    mine.write_text("mine")
    (tmp_path / "summary.json").symlink_to(mine)
    with pytest.raises(ConfigError, match="summary.json is a symbolic link"):
        write_text(tmp_path / "summary.json", "{}")
    with pytest.raises(ConfigError, match="summary.json is a symbolic link"):
        open_no_follow(tmp_path / "summary.json", os.O_WRONLY | os.O_TRUNC)
    assert mine.read_text() == "mine"


def test_temporary_names_of_long_names_stay_short_and_are_recognised(tmp_path: Path):
    long_name = "a" * 245 + ".json"  # valid: 250 bytes
    write_text(tmp_path / long_name, "{}")  # its temporary name would be 264 bytes
    assert (tmp_path / long_name).read_text() == "{}"
    leftover = f".{visible_name(long_name)}.abcd1234.tmp"
    assert len(leftover.encode()) <= 255
    assert leftovers_of(r"[\w-]+\.(?:json|jsonl|yaml|txt)").match(leftover)
    assert leftovers_of(r"step-\d+").match(f".{visible_name('step-' + '9' * 250)}.old.abcd1234")
    assert visible_name("é" * 200).encode()  # cut at character boundaries
