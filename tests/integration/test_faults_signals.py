"""Preemption is a normal event: SIGTERM or SIGINT during training saves a checkpoint at
the step boundary, exits 143 / 130 with one line saying how to resume, and the resumed
run's losses and weights equal an uninterrupted run's."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import cli_env, run_in_process, write_config
from factories import write_regression_data
from safetensors.torch import load_file

from memfit.monitor.metrics import losses_by_step, read_metrics


def config_file(tmp_path: Path, name: str, factory: str) -> Path:
    data = tmp_path / "regression.npz"
    if not data.exists():
        write_regression_data(data)
    return write_config(tmp_path / f"{name}.yaml", {
        "model": {"factory": f"factories:{factory}", "task": "custom"},
        "data": {"path": str(data), "format": "tensors", "eval_fraction": 0.25},
        "train": {"max_steps": 14, "micro_batch_size": 4, "save_every": 5, "eval_every": 4,
                  "output_dir": str(tmp_path / name)},
        "optimizer": {"lr": 1e-2}, "log": {"progress": False, "tensorboard": False}})


def assert_same_run(run: Path, reference: Path) -> None:
    for key in ("loss", "eval_loss"):  # the later record of a step re-run after resume wins
        assert losses_by_step(read_metrics(run), key) == pytest.approx(
            losses_by_step(read_metrics(reference), key), rel=1e-6)
    expected, got = (load_file(folder / "model" / "model.safetensors")
                     for folder in (reference, run))
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-6, atol=1e-7)


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [record["step"] for record in read_metrics(run_dir)
            if "loss" in record] if path.exists() else []


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("reference")
    config = config_file(folder, "run", "slow_regressor")
    assert run_in_process("train", str(config), cwd=folder).returncode == 0
    return folder / "run"


@pytest.mark.parametrize(("number", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_saves_at_the_step_boundary_and_resumes_exactly(
        tmp_path: Path, reference: Path, number: int, status: int):
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "memfit", "train", str(config_file(tmp_path, "run",
                                                                  "slow_regressor"))],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    deadline = time.monotonic() + 300
    while len(logged_steps(run)) < 3:
        assert process.poll() is None and time.monotonic() < deadline, "run ended before step 3"
        time.sleep(0.005)
    process.send_signal(number)
    _, stderr = process.communicate(timeout=300)

    assert process.returncode == status, stderr
    step = logged_steps(run)[-1]  # the step the signal landed in was finished and logged
    assert 3 <= step < 14
    name = signal.Signals(number).name
    assert [line for line in stderr.splitlines() if line.strip()] == [
        f"memfit: stopped by {name} after step {step}; checkpoint saved: "
        f"{run}/checkpoints/step-{step}; resume with: memfit train --resume {run}"]
    assert (run / "checkpoints" / f"step-{step}" / "trainer_state.json").is_file()
    assert not (run / "summary.json").exists()

    resumed = run_in_process("train", "--trust-code", "--resume", str(run), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(run, reference)


@pytest.fixture
def escaped_sigterms():
    """SIGTERMs that training did not handle: recorded here, where they would otherwise end
    pytest itself."""
    escaped: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda number, frame: escaped.append(number))
    yield escaped
    signal.signal(signal.SIGTERM, previous)


def test_a_signal_in_the_first_evaluation_saves_step_0_and_resumes(tmp_path: Path,
                                                                    escaped_sigterms):
    """The factory sends SIGTERM to this process from its first eval forward."""
    run = tmp_path / "run"
    stopped = run_in_process("train", str(config_file(tmp_path, "run", "signals_in_first_eval")),
                             cwd=tmp_path)
    assert stopped.returncode == 143, stopped.stderr
    assert stopped.stderr.strip() == (
        f"memfit: stopped by SIGTERM after step 0; checkpoint saved: {run}/checkpoints/step-0; "
        f"resume with: memfit train --resume {run}")
    assert logged_steps(run) == [] and escaped_sigterms == []

    resumed = run_in_process("train", "--trust-code", "--resume", str(run), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    uninterrupted = run_in_process(  # the marker file is there now: no signal this time
        "train", str(config_file(tmp_path, "uninterrupted", "signals_in_first_eval")),
        cwd=tmp_path)
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    assert_same_run(run, tmp_path / "uninterrupted")
