"""Faults on one rank of an FSDP or DDP job: every rank reaches the same decision at the same
step (a nan loss on rank 1 stops both; a SIGTERM to rank 1 makes both save that step and
stop), instead of one rank waiting forever in a collective. The subprocess timeouts only
guard against such a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dist_factories import write_regression_rows
from dist_helpers import memfit, memfit_environment

from memfit.monitor.metrics import losses_by_step, read_metrics

pytestmark = pytest.mark.slow


def config_file(tmp_path: Path, factory: str, strategy: str = "fsdp") -> Path:
    write_regression_rows(tmp_path / "rows.npz")
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {{factory: 'fault_factories:{factory}', task: custom}}\n"
        f"data: {{path: {tmp_path / 'rows.npz'}, format: tensors, eval_fraction: 0}}\n"
        f"train: {{output_dir: {tmp_path / 'run'}, max_steps: 6, micro_batch_size: 2, "
        "save_every: 2}\n"
        f"distributed: {{strategy: {strategy}}}\n"
        "log: {progress: false, tensorboard: false}\n")
    return config


def the_line(stderr: str, start: str) -> str:
    """The job's only line on stderr, which starts with ``start``: both ranks reach the same
    decision (the checkpoint each test checks needs both in its collective save), and the
    launcher prints it once."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), stderr
    return lines[0]


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_a_nan_loss_on_one_rank_stops_every_rank_at_that_step(tmp_path: Path, strategy: str):
    run = tmp_path / "run"
    result = memfit("train", str(config_file(tmp_path, "nan_on_rank_one", strategy)),
                    "--nproc", "2",
                    cwd=tmp_path, timeout=240)
    assert result.returncode == 3, result.stderr  # divergence, as in one process
    the_line(result.stderr, "memfit: error: loss became nan at step 3; last finite "
                            f"checkpoint: {run}/checkpoints/step-2; ")
    assert sorted(path.name for path in run.glob("checkpoints/step-*")) == ["step-2"]
    assert not (run / "summary.json").exists()


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_sigterm_to_one_rank_saves_that_step_on_every_rank_then_resumes(tmp_path: Path,
                                                                         strategy: str):
    run = tmp_path / "run"
    stopped = memfit("train", str(config_file(tmp_path, "sigterm_on_rank_one", strategy)),
                     "--nproc", "2", cwd=tmp_path, timeout=240)
    assert stopped.returncode == 143, stopped.stderr
    assert the_line(stopped.stderr, "memfit: stopped by") == (
        f"memfit: stopped by SIGTERM after step 3; checkpoint saved: {run}/checkpoints/step-3; "
        f"resume with: memfit train --resume {run}")
    assert (run / "checkpoints" / "step-3").is_dir()

    resumed = memfit("train", "--trust-code", "--resume", str(run), cwd=tmp_path, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(losses_by_step(read_metrics(run))) == [1, 2, 3, 4, 5, 6]
    assert (run / "summary.json").is_file()


def test_sigterm_to_the_launcher_stops_the_job_like_one_process(tmp_path: Path):
    """`memfit train --nproc 2` itself gets SIGTERM (a scheduler preempting the job): it
    passes it on and waits, the workers save the step they reach, and the job exits 143."""
    run = tmp_path / "run"
    config = config_file(tmp_path, "slow_regressor")
    config.write_text(config.read_text().replace("max_steps: 6", "max_steps: 400"))
    launcher = subprocess.Popen([sys.executable, "-m", "memfit", "train", str(config),
                                 "--nproc", "2"], cwd=tmp_path, env=memfit_environment(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while len(losses_by_step(read_metrics(run))) < 2:
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
        time.sleep(0.05)
    os.kill(launcher.pid, signal.SIGTERM)
    stderr = launcher.communicate(timeout=240)[1]
    assert launcher.returncode == 143, stderr
    stop = the_line(stderr, "memfit: stopped by SIGTERM after step ")
    step = int(stop.split("after step ")[1].split(";")[0])
    assert (run / "checkpoints" / f"step-{step}").is_dir()
    assert not (run / "summary.json").exists()
