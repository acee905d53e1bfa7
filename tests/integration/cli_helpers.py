"""Helpers for end-to-end tests: small data files, config files and a CLI runner.

A module of its own, not conftest.py: several test folders have a conftest, and
`from conftest import ...` would pick whichever pytest imported first."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def write_instructions(path: Path, rows: int = 48) -> Path:
    """Variable-length prompt/response rows (lengths differ so padding matters)."""
    words = ["apple", "river", "stone", "cloud", "ember", "field", "glass", "honey"]
    with path.open("w") as handle:
        for index in range(rows):
            count = 1 + index % 5
            item = " ".join(words[(index + k) % len(words)] for k in range(count))
            handle.write(json.dumps({"prompt": f"Repeat twice: {item}",
                                     "response": f"{item} {item}"}) + "\n")
    return path


def cli_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    # Test helper modules (factories) are importable by the CLI subprocess.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    return env


def run_cli(*arguments: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfit", *arguments], cwd=cwd,
                          capture_output=True, text=True, env=cli_env(), timeout=timeout)


def write_config(path: Path, mapping: dict) -> Path:
    path.write_text(yaml.safe_dump(mapping))
    return path


def regression_config(folder: Path, output_dir: Path, tensorboard: bool = False,
                      **train) -> Path:
    """A config file (in ``folder``) for the factory regressor on its .npz data: 4 steps,
    checkpoints at 2 and 4, written to ``output_dir``; ``train`` keys override."""
    from factories import write_regression_data

    data = folder / "regression.npz"
    if not data.exists():
        write_regression_data(data)
    return write_config(folder / f"{output_dir.name}.yaml", {
        "model": {"factory": "factories:regressor", "task": "custom"},
        "data": {"path": str(data), "format": "tensors", "eval_fraction": 0.25},
        "train": {"max_steps": 4, "micro_batch_size": 4, "save_every": 2,
                  "output_dir": str(output_dir), **train},
        "optimizer": {"lr": 1e-2}, "log": {"progress": False, "tensorboard": tensorboard}})


def tiny_run_arguments(data: Path, output_dir: Path, *extra: str) -> list[str]:
    """A config file for the tiny Llama preset on ``data`` (written beside the run folder),
    followed by ``extra`` key=value overrides."""
    config = output_dir.parent / f"{output_dir.name}.yaml"
    config.write_text(
        "model: {preset: tiny-llama}\n"
        f"data: {{path: {data}, format: instruction, max_length: 64}}\n"
        f"train: {{output_dir: {output_dir}}}\n"
        "log: {progress: false}\n")
    return [str(config), *extra]


def optimizer_run(folder: Path, instructions: Path, optimizer: str) -> tuple[Path, Path]:
    """(run.yaml in ``folder``, its run folder): the tiny Llama on ``instructions`` for 4
    steps, checkpoints at 2 and 4, with the YAML mapping ``optimizer`` ("{name: sgd}")."""
    run_dir = folder / "run"
    (folder / "run.yaml").write_text(
        "model: {preset: tiny-llama}\n"
        f"data: {{path: {instructions}, format: instruction, max_length: 64}}\n"
        f"optimizer: {optimizer}\n"
        f"train: {{output_dir: {run_dir}, max_steps: 4, save_every: 2}}\n"
        "log: {progress: false, tensorboard: false}\n")
    return folder / "run.yaml", run_dir


def losses_resumed_at_step_2(run_dir: Path, cwd: Path, *flags: str) -> dict[int, float]:
    """The losses of steps 3 and 4 when the 4-step run in ``run_dir`` resumes from its
    step-2 checkpoint (its step-4 one and its records removed), run from ``cwd``."""
    from memfit.monitor.metrics import losses_by_step, read_metrics

    shutil.rmtree(run_dir / "checkpoints" / "step-4")
    (run_dir / "metrics.jsonl").write_text("")
    result = run_in_process("train", *flags, "--resume", str(run_dir), cwd=cwd)
    assert result.returncode == 0, result.stderr
    return losses_by_step(read_metrics(run_dir))


def run_in_process(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    """``memfit ARGUMENTS`` in this process (no 5 s interpreter start-up per case), with
    ``cwd`` as the working directory; stdout/stderr and the exit status (SystemExit's
    too) as ``run_cli`` gives them. Not for what only a fresh process shows: a signal's
    real exit, other libraries' import-time output, environment variables."""
    import io

    from memfit.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                status = main(list(arguments))
            except SystemExit as stop:  # argparse's --help and usage errors
                # As the interpreter ends: None is 0, a message goes to stderr with 1.
                status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
                if stop.code is not None and not isinstance(stop.code, int):
                    print(stop.code, file=sys.stderr)
    finally:
        os.chdir(previous)
    return subprocess.CompletedProcess(["memfit", *arguments], status, stdout.getvalue(),
                                       stderr.getvalue())


# What run_cli_cases runs in its fresh interpreter: each case through run_in_process (a case
# that raises ends as the interpreter would end it: its traceback on stderr, status 1).
_CASES_RUNNER = """\
import json, sys, traceback, subprocess
from pathlib import Path
from cli_helpers import run_in_process
results = []
for arguments, cwd in json.loads(Path(sys.argv[1]).read_text()):
    try:
        done = run_in_process(*arguments, cwd=Path(cwd))
    except BaseException:
        done = subprocess.CompletedProcess(arguments, 1, "", traceback.format_exc())
    results.append([done.returncode, done.stdout, done.stderr])
Path(sys.argv[2]).write_text(json.dumps(results))
"""


def run_cli_cases(cases: list[tuple[list[str], Path]], scratch: Path,
                  timeout: float) -> list[subprocess.CompletedProcess]:
    """``memfit ARGUMENTS`` in ``cwd`` for each (arguments, cwd) case, one after the other
    in ONE fresh interpreter (one start-up of torch and transformers for all of them, about
    8 s each saved), each as ``run_in_process`` runs it; ``timeout`` guards the whole job
    (subprocess.run kills it). ``scratch``: a folder for the cases and results files,
    outside every case's cwd."""
    cases_file, results_file = scratch / "cases.json", scratch / "results.json"
    cases_file.write_text(json.dumps([[list(arguments), str(cwd)] for arguments, cwd in cases]))
    job = subprocess.run([sys.executable, "-c", _CASES_RUNNER, str(cases_file),
                          str(results_file)], cwd=scratch, capture_output=True, text=True,
                         env=cli_env(), timeout=timeout)
    assert job.returncode == 0, job.stderr
    return [subprocess.CompletedProcess(["memfit", *arguments], status, stdout, stderr)
            for (arguments, _), (status, stdout, stderr)
            in zip(cases, json.loads(results_file.read_text()), strict=True)]


def tree_digest(root: Path) -> dict[str, str]:
    """Every file and folder under ``root`` (relative path -> SHA-256 of the bytes, or
    "dir"), to assert that a refused command left what the user had byte-for-byte alone.
    ``__pycache__`` folders are left out: Python writes them when it imports the user's own
    module (a factory), unless PYTHONDONTWRITEBYTECODE is set; memfit writes none."""
    import hashlib

    if not root.exists():
        return {}
    found = {}
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.relative_to(root).parts:
            continue
        relative = str(path.relative_to(root))
        found[relative] = ("dir" if path.is_dir()
                           else hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def assert_one_line_error(result: subprocess.CompletedProcess, status: int,
                          *fragments: str) -> str:
    """The failure is exactly one non-empty stderr line starting ``memfit: error:`` (beside
    the run's own ``memfit: warning:`` lines), with exit ``status``, no traceback, and every
    fragment in it; returns the line."""
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines()
             if line.strip() and not line.startswith("memfit: warning: ")]
    assert len(lines) == 1 and lines[0].startswith("memfit: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@contextlib.contextmanager
def no_loading_bars() -> Iterator[None]:
    """What the CLI does for a fresh process (HF_HUB_DISABLE_PROGRESS_BARS, read when
    transformers is imported), for tests where transformers was imported already."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.enable_progress_bar()
