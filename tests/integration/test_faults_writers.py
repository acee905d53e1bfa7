"""What memfit writes outside `train`'s own steps, as a careless or hostile user meets it:
`memfit report` and `memfit bench --out` write only where memfit may (never through a link,
into a checkpoint, or over a user's files), a report never imports code a run folder names
and renders a summary with wrong-typed values, files get the user's umask, long names
work, and a run folder is never part of its own data."""

from __future__ import annotations

import html
import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli_helpers import (
    assert_one_line_error,
    run_in_process,
    tiny_run_arguments,
    tree_digest,
    write_instructions,
)

from memfit._utils.errors import ConfigError
from memfit.data.images import image_files
from memfit.training.run_folder import refuse_run_inside_data


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    """A finished 2-step LoRA run of the tiny Llama preset (checkpoints, TensorBoard,
    memory.png, adapter/), trained under a umask of 022."""
    folder = tmp_path_factory.mktemp("lora")
    data = write_instructions(folder / "rows.jsonl", rows=16)
    run = folder / "run"
    previous = os.umask(0o022)
    try:
        result = run_in_process("train", *tiny_run_arguments(
            data, run, "train.max_steps=2", "train.save_every=1", "adapter.kind=lora",
            "log.memory_every=1"), cwd=folder)
    finally:
        os.umask(previous)
    assert result.returncode == 0, result.stderr
    return run


def copy_run(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True)
    return copy


# --- the user's umask ------------------------------------------------------------------

def test_every_file_of_a_run_gets_the_users_umask(lora_run: Path):
    modes = {str(path.relative_to(lora_run)): stat.S_IMODE(path.lstat().st_mode)
             for path in [lora_run, *lora_run.rglob("*")]}
    assert any(name.endswith(".safetensors") for name in modes)  # checkpoints and adapter
    wrong = {name: oct(mode) for name, mode in modes.items()
             if mode != (0o755 if (lora_run / name).is_dir() else 0o644)}
    assert not wrong, wrong


# --- memfit report ---------------------------------------------------------------------

def test_report_refuses_a_checkpoint_folder(lora_run: Path, tmp_path: Path):
    run = copy_run(lora_run, tmp_path)
    checkpoint = run / "checkpoints" / "step-2"
    before = tree_digest(run)
    result = run_in_process("report", str(checkpoint), cwd=tmp_path)
    assert_one_line_error(result, 2, "not a memfit run folder", f"memfit report {run}")
    result = run_in_process("report", str(run), "--out", str(checkpoint / "report.html"),
                            cwd=tmp_path)
    assert_one_line_error(result, 2, "is a checkpoint folder")
    assert tree_digest(run) == before


@pytest.mark.parametrize("command", ["train", "bench", "report"])
def test_nothing_is_written_inside_a_checkpoint(lora_run: Path, tmp_path: Path, command: str):
    run = copy_run(lora_run, tmp_path)
    inside = run / "checkpoints" / "step-1" / "sub" / "new"
    before = tree_digest(run)
    if command == "train":
        config = tmp_path / "config.yaml"
        shutil.copy(run / "config.yaml", config)
        arguments = ["train", str(config), f"train.output_dir={inside}"]
    elif command == "bench":
        arguments = [*BENCH, "--out", str(inside)]
    else:
        arguments = ["report", str(run), "--out", str(inside / "report.html")]
    result = run_in_process(*arguments, cwd=tmp_path)
    assert_one_line_error(result, 2, str(run / "checkpoints" / "step-1"), "checkpoint folder")
    assert tree_digest(run) == before


@pytest.mark.parametrize("kind", ["fifo", "link", "folder", "link-to-folder"])
def test_report_out_must_be_a_plain_new_file(lora_run: Path, tmp_path: Path, kind: str):
    out = tmp_path / "report.html"
    mine = tmp_path / "mine"
    if kind == "fifo":
        os.mkfifo(out)  # reading it to check for an earlier report blocked forever
    elif kind == "folder":
        out.mkdir()
    else:
        if kind == "link":
            # Even a link to memfit's own earlier report: the link would be replaced.
            assert run_in_process("report", str(lora_run), "--out", str(mine),
                                  cwd=tmp_path).returncode == 0
        else:
            mine.mkdir()
        out.symlink_to(mine)
    before = tree_digest(mine), sorted(tmp_path.iterdir())  # (never read the FIFO here)
    result = run_in_process("report", str(lora_run), "--out", str(out), cwd=tmp_path)
    line = assert_one_line_error(result, 2, f"--out {out}")
    expected = {"fifo": "is a FIFO", "folder": "is a folder"}.get(kind, "is a symbolic link")
    assert expected in line
    assert (tree_digest(mine), sorted(tmp_path.iterdir())) == before
    assert stat.S_ISFIFO(out.lstat().st_mode) or kind != "fifo"


def test_report_renders_wrong_typed_values(lora_run: Path, tmp_path: Path):
    run = copy_run(lora_run, tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    summary.update(memory_peak_bytes="x", memory_peak_by_category={"weights": "big"},
                   final_loss="low", steps=[1, 2])
    (run / "summary.json").write_text(json.dumps(summary))
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": "x", "loss": 1.0}\n{"step": 3, "loss": "high", '
                     '"memory_peak_bytes": "many"}\n')
    out = tmp_path / "page.html"
    result = run_in_process("report", str(run), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    for marked in ('"x" (not a byte count)', '"big" (not a byte count)'):
        assert html.escape(marked) in page
    assert "plan (device=cpu)" in page  # the plan still renders beside them
    (run / "summary.json").write_text(json.dumps({**summary, "memory_peak_by_category": [1]}))
    assert run_in_process("report", str(run), "--out", str(out), cwd=tmp_path).returncode == 0


def test_report_never_imports_code_a_run_folder_names(lora_run: Path, tmp_path: Path):
    run = copy_run(lora_run, tmp_path)
    imported = tmp_path / "imported"
    module = tmp_path / "evil.py"
    module.write_text(f"open({str(imported)!r}, 'w').close()\n"
                      "from memfit.models.presets import tiny_llama as build\n")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"].update(preset=None, factory=f"{module}:build", task="causal-lm")
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "page.html"
    result = run_in_process("report", str(run), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not imported.exists()
    assert "no plan: the run&#x27;s config.yaml names code to import (model.factory=" \
        in out.read_text()


# --- long names --------------------------------------------------------------------------

def test_long_file_names_are_written(lora_run: Path, tmp_path: Path):
    """Valid names of 250 bytes, whose temporary names would pass the 255-byte limit."""
    out = tmp_path / ("r" * 245 + ".html")
    result = run_in_process("report", str(lora_run), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    merged = tmp_path / ("m" * 250)
    result = run_in_process("merge", str(lora_run), "--out", str(merged), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (merged / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, merged.name])


# --- memfit bench --out ------------------------------------------------------------------

BENCH = ("bench", "--suite", "memory", "--model", "tiny-llama", "--steps", "1",
         "--cases", "memfit LoRA")


def test_bench_refuses_a_folder_it_did_not_make(tmp_path: Path):
    out = tmp_path / "results"
    (out / "runs" / "memfit-lora").mkdir(parents=True)
    (out / "runs" / "memfit-lora" / "notes.txt").write_text("mine")
    (out / "results.json").write_text('{"mine": true}')
    before = tree_digest(tmp_path)
    result = run_in_process(*BENCH, "--out", str(out), cwd=tmp_path)
    assert_one_line_error(result, 2, f"--out {out}", "not a memfit bench folder",
                          "memfit-bench.json")
    assert tree_digest(tmp_path) == before


def test_bench_reuses_a_folder_it_made(tmp_path: Path):
    out = tmp_path / "bench"
    (out / "runs" / "memfit-lora").mkdir(parents=True)  # an earlier bench's run of the case
    (out / "runs" / "memfit-lora" / "metrics.jsonl").write_text('{"step": 9}\n')
    (out / "memfit-bench.json").write_text("{}")
    (out / "my-notes.md").write_text("mine")
    result = run_in_process(*BENCH, "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (out / "my-notes.md").read_text() == "mine"
    steps = [json.loads(line)["step"] for line in
             (out / "runs" / "memfit-lora" / "metrics.jsonl").read_text().splitlines()]
    assert 9 not in steps and (out / "bench.md").is_file()


@pytest.mark.parametrize("where", ["out", "runs", "logs", "results.json"])
def test_bench_never_writes_through_a_link(tmp_path: Path, where: str):
    out = tmp_path / "bench"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "memfit-lora").mkdir()
    (mine / "memfit-lora" / "thesis.tex").write_text("years of work")
    (mine / "memfit-lora.log").write_text("my log")
    if where == "out":
        out.symlink_to(mine)
    else:
        out.mkdir()
        (out / "memfit-bench.json").write_text("{}")  # a folder bench made before
        (out / where).symlink_to(mine / "memfit-lora.log" if where == "results.json" else mine)
    before = tree_digest(mine)
    result = run_in_process(*BENCH, "--out", str(out), cwd=tmp_path)
    assert_one_line_error(result, 2, "symbolic link")
    assert tree_digest(mine) == before


# --- a run folder is never part of its data ----------------------------------------------

def test_a_run_inside_its_data_folder_is_refused(tmp_path: Path):
    data = tmp_path / "scans"
    (data / "cat").mkdir(parents=True)
    np.save(data / "cat" / "a.npy", np.zeros((4, 4), dtype=np.float32))
    paths = {"data.path": str(data), "data.eval_path": None}
    with pytest.raises(ConfigError, match=r"train.output_dir=.*runs/1 is inside data.path"):
        refuse_run_inside_data(str(data / "runs" / "1"), paths)
    with pytest.raises(ConfigError, match=r"default run folder runs/ .* inside data.path"):
        os.chdir(data)
        try:
            refuse_run_inside_data(None, paths)
        finally:
            os.chdir(tmp_path)
    refuse_run_inside_data(str(tmp_path / "run"), paths)  # beside the data: fine


def test_images_never_read_a_run_folder(tmp_path: Path):
    data = tmp_path / "scans"
    (data / "cat").mkdir(parents=True)
    np.save(data / "cat" / "a.npy", np.zeros((4, 4), dtype=np.float32))
    run = data / "run"  # made by a memfit before runs were refused there
    run.mkdir()
    (run / "memfit-run.json").write_text("{}")
    shutil.copy(data / "cat" / "a.npy", run / "memory.npy")
    assert image_files(str(data)) == [str(data / "cat" / "a.npy")]
