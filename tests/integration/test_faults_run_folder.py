"""The run folder as a hostile or careless user meets it: nothing the user had is deleted
or mixed, two runs never share a folder, a resume is the same run, and its record covers
the whole run. Each refusal is one line, exit 2, with the user's files byte-for-byte
unchanged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import (
    assert_one_line_error,
    cli_env,
    regression_config,
    run_in_process,
    tiny_run_arguments,
    tree_digest,
    write_config,
)
from factories import write_regression_data

from memfit.config.resume import RESUMABLE_KEYS
from memfit.monitor.metrics import read_metrics
from memfit.training.run_folder import RunFolder, create_run_folder


def train_regression(tmp_path: Path, output_dir: Path, *overrides: str, **train):
    config = regression_config(tmp_path, output_dir, **train)
    result = run_in_process("train", str(config), *overrides, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def adapter_run(tmp_path_factory) -> Path:
    """A finished LoRA run of the tiny Llama preset (merge's input)."""
    from cli_helpers import write_instructions

    folder = tmp_path_factory.mktemp("adapter")
    data = write_instructions(folder / "rows.jsonl", rows=16)
    run_dir = folder / "run"
    arguments = tiny_run_arguments(data, run_dir, "train.max_steps=2", "adapter.kind=lora",
                                   "log.tensorboard=false")
    result = run_in_process("train", *arguments, cwd=folder)
    assert result.returncode == 0, result.stderr
    return run_dir


# --- memfit merge --out ------------------------------------------------------------------

def test_merge_refuses_a_folder_with_content(tmp_path: Path, adapter_run: Path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.txt").write_text("years of work")
    before = tree_digest(tmp_path)
    result = run_in_process("merge", "--trust-code",
                            str(adapter_run), "--out", str(out), cwd=tmp_path)
    assert_one_line_error(result, 2, str(out), "not empty", "--force")
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("where", ["run", "inside-run", "run-parent", "cwd", "cwd-parent"])
def test_merge_refuses_the_run_or_the_current_directory(tmp_path: Path, adapter_run: Path,
                                                        where: str):
    work = tmp_path / "work"
    work.mkdir()
    out = {"run": adapter_run, "inside-run": adapter_run / "merged",
           "run-parent": adapter_run.parent, "cwd": work, "cwd-parent": tmp_path}[where]
    before_run, before_work = tree_digest(adapter_run.parent), tree_digest(tmp_path)
    result = run_in_process("merge", "--trust-code",
                            str(adapter_run), "--out", str(out), "--force", cwd=work)
    assert_one_line_error(result, 2, "--out")
    assert tree_digest(adapter_run.parent) == before_run
    assert tree_digest(tmp_path) == before_work


def test_merge_force_replaces_only_once_the_new_model_is_complete(tmp_path: Path,
                                                                  adapter_run: Path):
    out = tmp_path / "merged"
    out.mkdir()
    (out / "old.txt").write_text("old")
    result = run_in_process("merge", "--trust-code", str(adapter_run), "--out", str(out), "--force",
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (out / "model.safetensors").is_file() and not (out / "old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]  # no staging left


def test_merge_checks_its_out_folder_before_merging(tmp_path: Path, adapter_run: Path):
    (tmp_path / "notes.txt").write_text("mine")
    before = tree_digest(tmp_path)
    for out in (tmp_path / "notes.txt" / "merged", Path("/proc/memfit-merged")):
        result = run_in_process("merge", "--trust-code",
                                str(adapter_run), "--out", str(out), cwd=tmp_path)
        assert_one_line_error(result, 2, f"--out {out} cannot be created")
    assert tree_digest(tmp_path) == before


def test_report_never_overwrites_a_file_it_did_not_write(tmp_path: Path, adapter_run: Path):
    mine = tmp_path / "index.html"
    mine.write_text("<html>my homepage</html>")
    result = run_in_process("report", str(adapter_run), "--out", str(mine), cwd=tmp_path)
    assert_one_line_error(result, 2, str(mine), "not a memfit report")
    assert mine.read_text() == "<html>my homepage</html>"
    out = tmp_path / "report.html"
    for _ in range(2):  # its own earlier report is replaced
        result = run_in_process("report", str(adapter_run), "--out", str(out), cwd=tmp_path)
        assert result.returncode == 0, result.stderr


def test_report_of_a_damaged_summary_is_one_line(tmp_path: Path, adapter_run: Path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(adapter_run, run)
    (run / "summary.json").write_text("{not json")
    result = run_in_process("report", str(run), "--out", str(tmp_path / "r.html"),
                            cwd=tmp_path)
    assert_one_line_error(result, 2, "summary.json is not valid JSON (line 1, column 2")
    assert not (tmp_path / "r.html").exists()


def test_merge_refuses_a_pickled_adapter(tmp_path: Path, adapter_run: Path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(adapter_run, run)
    (run / "adapter" / "adapter_model.safetensors").rename(run / "adapter" / "adapter_model.bin")
    result = run_in_process("merge", "--trust-code",
                            str(run), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert_one_line_error(result, 2, "adapter_model.safetensors")
    assert not (tmp_path / "out").exists()


# --- train.output_dir --------------------------------------------------------------------

def test_output_dir_that_is_not_a_run_is_refused(tmp_path: Path):
    mine = tmp_path / "photos"
    mine.mkdir()
    (mine / "cat.jpg").write_bytes(b"\xff\xd8 a cat")
    before = tree_digest(tmp_path)
    config = regression_config(tmp_path, mine)
    before = tree_digest(tmp_path)
    result = run_in_process("train", str(config), cwd=tmp_path)
    assert_one_line_error(result, 2, "train.output_dir", "not a memfit run folder", "cat.jpg")
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("kind", ["under-a-file", "a-file", "unwritable"])
def test_impossible_output_dir_is_refused_before_the_model_is_built(tmp_path: Path, kind: str):
    (tmp_path / "notes.txt").write_text("mine")
    output_dir = {"under-a-file": tmp_path / "notes.txt" / "run", "a-file": tmp_path / "notes.txt",
                  "unwritable": Path("/proc/memfit-run")}[kind]
    config = write_config(tmp_path / "bad.yaml", {
        # A factory that would fail if it were ever called: the folder is checked first.
        "model": {"factory": "no_such_package.models:build", "task": "custom"},
        "data": {"path": str(tmp_path / "missing.npz"), "format": "tensors"},
        "train": {"output_dir": str(output_dir)}})
    before = tree_digest(tmp_path)
    result = run_in_process("train", str(config), cwd=tmp_path)
    assert_one_line_error(result, 2, "train.output_dir")
    assert tree_digest(tmp_path) == before


def test_an_empty_existing_folder_is_used(tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    train_regression(tmp_path, empty)
    assert (empty / "summary.json").is_file()


def test_a_run_with_progress_is_never_restarted(tmp_path: Path):
    run = tmp_path / "run"
    train_regression(tmp_path, run)
    before = tree_digest(run)
    result = run_in_process("train", str(tmp_path / "run.yaml"), cwd=tmp_path)
    assert_one_line_error(result, 2, "already holds a run", "--resume")
    assert tree_digest(run) == before


def test_default_run_folders_never_collide(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda *args: "20261201-120000")
    first, second = create_run_folder(None), create_run_folder(None)
    try:
        assert first.path == Path("runs/20261201-120000")
        assert second.path == Path("runs/20261201-120000-2")
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("how", ["resume", "same-command"])
def test_a_live_run_cannot_be_shared(tmp_path: Path, how: str):
    run = tmp_path / "run"
    train_regression(tmp_path, run)
    if how == "same-command":  # a run with no progress yet, as a second start would see
        for name in ("checkpoints", "model", "summary.json"):
            path = run / name
            subprocess.run(["rm", "-rf", str(path)], check=True)
    live = RunFolder(run)  # what a training process holds for its whole lifetime
    try:
        before = tree_digest(run)
        arguments = (["--trust-code", "--resume", str(run)] if how == "resume"
                     else [str(tmp_path / "run.yaml")])
        result = run_in_process("train", *arguments, cwd=tmp_path)
        assert_one_line_error(result, 2, str(run), "in use by a running memfit")
        assert tree_digest(run) == before
    finally:
        live.close()


def start_slow_run(tmp_path: Path, output_dir: Path, **train) -> subprocess.Popen:
    config = regression_config(tmp_path, output_dir, **train)
    text = config.read_text().replace("factories:regressor", "factories:slow_regressor")
    config.write_text(text)
    return subprocess.Popen([sys.executable, "-m", "memfit", "train", str(config)],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def kill_when(process: subprocess.Popen, ready) -> None:
    deadline = time.monotonic() + 300
    while not ready():
        assert process.poll() is None and time.monotonic() < deadline, "run ended too soon"
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


def logged_steps(run: Path) -> int:
    path = run / "metrics.jsonl"
    return path.read_text().count('"loss"') if path.is_file() else 0


@pytest.mark.slow
@pytest.mark.parametrize("how", ["same-command", "resume"])
def test_a_run_killed_before_its_first_checkpoint_starts_again(tmp_path: Path, how: str):
    run = tmp_path / "run"
    # 30 steps: a kill after step 2 always lands long before the run could finish.
    process = start_slow_run(tmp_path, run, max_steps=30, save_every=0)
    kill_when(process, lambda: logged_steps(run) >= 2)
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())

    arguments = ["--trust-code",
                 "--resume", str(run)] if how == "resume" else [str(tmp_path / "run.yaml")]
    result = run_in_process("train", *arguments, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    steps = [r["step"] for r in read_metrics(run) if "loss" in r]
    assert steps == list(range(1, 31))
    assert [r["step"] for r in read_metrics(run) if "eval_loss" in r] == [0, 30]


# --- resume is the same run --------------------------------------------------------------

@pytest.mark.parametrize("override", ["optimizer.lr=1.0", "train.seed=3", "adapter.kind=lora",
                                      "train.micro_batch_size=2", "optimizer.name=sgd"])
def test_resume_refuses_changes_to_what_is_trained(tmp_path: Path, override: str):
    run = tmp_path / "run"
    train_regression(tmp_path, run)
    before = tree_digest(run)
    result = run_in_process("train", "--trust-code", "--resume", str(run), override, cwd=tmp_path)
    line = assert_one_line_error(result, 2, override.split("=")[0], "train.max_steps")
    assert all(key in line for key in RESUMABLE_KEYS)
    assert tree_digest(run) == before


def test_resume_refuses_a_hand_edited_config(tmp_path: Path):
    """The run's config.yaml is where --resume reads the config from: an edit there is a
    change too, caught against the configuration the checkpoint was trained with."""
    run = tmp_path / "run"
    train_regression(tmp_path, run, max_steps=2)
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("lr: 0.01", "lr: 1.0"))
    before = tree_digest(run)
    result = run_in_process("train", "--trust-code",
                            "--resume", str(run), "train.max_steps=4", cwd=tmp_path)
    assert_one_line_error(result, 2, "cannot change optimizer.lr (0.01 -> 1.0)", "config.yaml")
    assert tree_digest(run) == before


@pytest.mark.parametrize("change", ["contents", "size"])
def test_resume_refuses_data_that_changed(tmp_path: Path, change: str):
    run = tmp_path / "run"
    train_regression(tmp_path, run, max_steps=2)
    data = tmp_path / "regression.npz"
    if change == "size":
        write_regression_data(data, rows=80)
    else:
        write_regression_data(data, seed=1)
    before = tree_digest(run)
    result = run_in_process("train", "--trust-code",
                            "--resume", str(run), "train.max_steps=4", cwd=tmp_path)
    assert_one_line_error(result, 2, "the data changed since the run started",
                          f"regression.npz ({change})")
    assert tree_digest(run) == before


def test_resume_may_split_the_same_effective_batch_differently(tmp_path: Path):
    run = tmp_path / "run"
    train_regression(tmp_path, run, max_steps=2, lr_schedule="constant")
    reference = tmp_path / "reference"
    train_regression(tmp_path, reference, max_steps=4, lr_schedule="constant")
    result = run_in_process("train", "--trust-code", "--resume", str(run), "train.max_steps=4",
                            "train.micro_batch_size=2", "train.gradient_accumulation_steps=2",
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    resumed, expected = ({r["step"]: r["loss"] for r in read_metrics(folder) if "loss" in r}
                         for folder in (run, reference))
    assert resumed == pytest.approx(expected, rel=1e-5)


def test_a_run_given_relative_paths_resumes_from_another_folder(tmp_path: Path):
    run = tmp_path / "run"
    config = regression_config(tmp_path, run, max_steps=2)
    result = run_in_process("train", str(config), "data.path=regression.npz", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_in_process("train", "--trust-code",
                            "--resume", str(run), "train.max_steps=3", cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == [1, 2, 3]


def test_resume_applies_accepted_overrides(tmp_path: Path):
    run = tmp_path / "run"
    train_regression(tmp_path, run)
    reference = tmp_path / "reference"
    train_regression(tmp_path, reference, max_steps=7)

    result = run_in_process("train", "--trust-code",
                            "--resume", str(run), "train.max_steps=7", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "max_steps: 7" in (run / "config.yaml").read_text()
    resumed = {r["step"]: r for r in read_metrics(run) if "loss" in r}
    expected = {r["step"]: r for r in read_metrics(reference) if "loss" in r}
    assert sorted(resumed) == list(range(1, 8))
    # Steps 5-7 follow the 7-step schedule (the first 4 ran under the 4-step one).
    for step in (5, 6, 7):
        assert resumed[step]["lr"] == pytest.approx(expected[step]["lr"], rel=1e-9)


def test_resume_removes_what_a_killed_export_left_and_exports_again(tmp_path: Path):
    """Killed after the last checkpoint, while exporting: the run has no summary yet."""
    run = tmp_path / "run"
    train_regression(tmp_path, run)
    (run / "summary.json").unlink()
    (run / "model").rename(run / ".model.k1ll3d_x")
    (run / ".summary.json.abcd1234.tmp").write_text("{")
    (run / ".my-notes").write_text("mine")  # a dot-file of the user's stays
    result = run_in_process("train", "--trust-code", "--resume", str(run), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (run / "model" / "model.safetensors").is_file() and (run / "summary.json").is_file()
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == [
        ".memfit.lock", ".my-notes"]


def test_resuming_a_finished_run_changes_nothing(tmp_path: Path):
    run = tmp_path / "run"
    train_regression(tmp_path, run)
    before = tree_digest(run)
    result = run_in_process("train", "--trust-code", "--resume", str(run), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "already finished at step 4" in result.stderr
    assert tree_digest(run) == before


@pytest.mark.slow
def test_the_record_of_a_resumed_run_is_the_whole_run(tmp_path: Path):
    """Killed once it has logged step 5, between checkpoints (every 4 steps): the steps
    after the newest checkpoint run again and replace (not duplicate) their records; the
    summary covers the run from step 0."""
    reference = tmp_path / "reference"
    train_regression(tmp_path, reference, max_steps=20, save_every=4)

    run = tmp_path / "run"
    process = start_slow_run(tmp_path, run, max_steps=20, save_every=4)
    kill_when(process, lambda: logged_steps(run) >= 5)
    result = run_in_process("train", "--trust-code", "--resume", str(run), cwd=tmp_path)
    assert result.returncode == 0, result.stderr

    steps = [r["step"] for r in read_metrics(run) if "loss" in r]
    assert steps == list(range(1, 21))
    summary, expected = (json.loads((r / "summary.json").read_text()) for r in (run, reference))
    for key in ("steps", "first_loss", "final_loss", "eval_loss_before", "eval_loss_after",
                "examples"):
        assert summary[key] == pytest.approx(expected[key], rel=1e-6), key
    assert summary["train_seconds"] > 0


# --- a full disk ---------------------------------------------------------------------------

@pytest.mark.skipif(sys.platform != "linux", reason="a private tmpfs needs Linux namespaces")
def test_a_full_disk_is_one_line_and_leaves_no_half_written_checkpoint(tmp_path: Path):
    """A real full disk: a 160 KiB tmpfs mounted in a private mount namespace."""
    disk = tmp_path / "disk"
    disk.mkdir()
    config = regression_config(tmp_path, disk / "run", max_steps=50, save_every=1)
    # The tmpfs vanishes with the namespace: list what the failed run left from inside it.
    script = (f"mount -t tmpfs -o size=160k tmpfs {disk} && {{ {sys.executable} -m memfit "
              f"train {config}; status=$?; echo LEFT:; ls -a {disk}/run/checkpoints; "
              "exit $status; }")
    result = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", script],
                            cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                            timeout=300)
    assert_one_line_error(result, 2, "disk is full", "resume")
    left = result.stdout.split("LEFT:")[1].split()
    assert any(name.startswith("step-") for name in left), left  # earlier ones survive
    assert not [name for name in left if name.startswith(".step-")], left


@pytest.mark.skipif(sys.platform != "linux", reason="a private read-only mount needs Linux")
def test_resuming_on_a_read_only_mount_is_one_line(tmp_path: Path):
    run = tmp_path / "run"
    train_regression(tmp_path, run, max_steps=2)
    (run / ".memfit.lock").unlink()  # as a copy of the run without it would be
    script = (f"mount --bind {run} {run} && mount -o remount,bind,ro {run} && "
              f"exec {sys.executable} -m memfit train --trust-code --resume {run} "
              "train.max_steps=4")
    result = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", script],
                            cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                            timeout=300)
    assert_one_line_error(result, 2, f"{run} cannot be written")


def test_resume_given_a_checkpoint_folder_points_to_its_run(tmp_path: Path):
    run = tmp_path / "run"
    train_regression(tmp_path, run, max_steps=2)
    before = tree_digest(run)
    result = run_in_process("train", "--trust-code",
                            "--resume", str(run / "checkpoints" / "step-2"),
                            cwd=tmp_path)
    assert_one_line_error(result, 2, "not a memfit run folder", f"did you mean --resume {run}?")
    assert tree_digest(run) == before
