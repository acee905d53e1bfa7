"""What goes wrong around ``memfit train --nproc 2`` ends as it does in one process: one
line and the documented exit status (never torchrun's report or one line per rank),
workers import what one process imports, a stop signal sent to the launcher alone is
passed on, and a launcher killed outright takes its workers with it. The launcher runs
as ``python -P -m memfit``, as the ``memfit`` script does (the current directory is not on
its sys.path). Subprocess timeouts and the bounded waits only guard against a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from dist_factories import write_regression_rows
from dist_helpers import memfit_environment
from torch import nn

from memfit.cli import main
from memfit.monitor.metrics import losses_by_step, read_metrics

pytestmark = pytest.mark.slow

MEMFIT = [sys.executable, "-P", "-m", "memfit"]
# Modules a worker imports; any of them in the current directory must stay unimported.
SHADOWS = ("peft.py", "torch.py", "yaml.py")


class Regressor(nn.Module):
    """A linear regression; ``fault`` happens on rank 1 at its third training forward."""

    def __init__(self, fault: str | None = None, seconds: float = 0.0):
        super().__init__()
        self.head, self.fault, self.seconds, self.forwards = nn.Linear(8, 1), fault, seconds, 0

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)  # slow enough for a signal sent from outside to land mid-run
        self.forwards += self.training
        if self.fault == "sigkill" and dist.get_rank() == 1 and self.forwards == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer does
        return F.mse_loss(self.head(inputs), targets)


def regressor() -> nn.Module:
    return Regressor()


def slow_regressor() -> nn.Module:
    return Regressor(seconds=0.1)


def killed_on_rank_one() -> nn.Module:
    return Regressor("sigkill")


def config_file(folder: Path, factory: str, max_steps: int = 4) -> Path:
    write_regression_rows(folder / "rows.npz")
    config = folder / f"{factory}.yaml"
    config.write_text(
        f"model: {{factory: 'test_launcher_faults:{factory}', task: custom}}\n"
        f"data: {{path: {folder / 'rows.npz'}, format: tensors, eval_fraction: 0}}\n"
        f"train: {{output_dir: {folder / factory}, max_steps: {max_steps}, "
        "micro_batch_size: 2, save_every: 2}\n"
        "distributed: {strategy: ddp}\n"
        "log: {progress: false, tensorboard: false}\n")
    return config


def memfit(*arguments: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*MEMFIT, *arguments], cwd=cwd, capture_output=True, text=True,
                          env=env or memfit_environment(), timeout=300)


def one_line(result: subprocess.CompletedProcess, status: int, start: str) -> str:
    """The job's only line on stderr, which exited with ``status``."""
    assert result.returncode == status, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-process run, trained from a folder holding a peft.py, torch.py and yaml.py
    that leave a mark when imported, with --nproc between the config and an override."""
    folder = tmp_path_factory.mktemp("trained")
    config = config_file(folder, "regressor")
    for name in SHADOWS:
        (folder / name).write_text(f"open({name!r} + '.imported', 'w').close()\n"
                                   f"raise SystemExit('{name} imported')\n")
    result = memfit("train", str(config), "--nproc", "2", "train.max_steps=4", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert not list(folder.glob("*.imported"))
    return folder / "regressor"


def test_workers_never_import_modules_from_the_current_directory(trained: Path):
    assert sorted(losses_by_step(read_metrics(trained))) == [1, 2, 3, 4]


def test_a_refused_resume_is_one_line_with_status_2(trained: Path):
    result = memfit("train", "--resume", str(trained), "optimizer.lr=0.5",
                    "--nproc", "2", "--trust-code", cwd=trained.parent)
    line = one_line(result, 2, "memfit: error: ")
    assert "optimizer.lr" in line


def test_nproc_among_the_overrides_and_its_range(tmp_path: Path, capsys):
    config = config_file(tmp_path, "regressor")
    assert main(["train", str(config), "--nproc", "2", "train.max_steps=7",
                 "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "nproc: 2" in printed and "max_steps: 7" in printed
    assert main(["train", "--nproc", "2", "distributed.strategy=fsdp", "train.save_every=3",
                 "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert "strategy: fsdp" in printed and "save_every: 3" in printed
    for count in ("0", "-1", "100000"):
        assert main(["train", str(config), "--nproc", count]) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"memfit: error: --nproc {count}: give 1 to ")
        assert len(error.splitlines()) == 1


def test_a_worker_environment_left_in_the_shell_is_one_line(tmp_path: Path):
    """Without torchrun's TORCHELASTIC_RUN_ID, WORLD_SIZE & co. are stale: taken as a
    worker, the process would wait ten minutes for a rendezvous nobody joins."""
    stale = dict(memfit_environment(), WORLD_SIZE="2", RANK="0", MASTER_ADDR="127.0.0.1",
                 MASTER_PORT="9")
    result = memfit("train", str(config_file(tmp_path, "regressor")), "--nproc", "2",
                    cwd=tmp_path, env=stale)
    line = one_line(result, 2, "memfit: error: distributed.nproc=2, but this shell has ")
    assert "unset WORLD_SIZE RANK MASTER_ADDR MASTER_PORT" in line


def test_a_worker_killed_by_a_signal_is_named_with_128_plus_it(tmp_path: Path):
    result = memfit("train", str(config_file(tmp_path, "killed_on_rank_one")), "--nproc", "2",
                    cwd=tmp_path)
    assert one_line(result, 137, "memfit: error: worker rank 1 was killed by SIGKILL ")


def worker_pids(run: Path) -> list[int]:
    """Processes whose command line names ``run`` (the job's workers, and the launcher)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(run) in (entry / "cmdline").read_text():
                pids.append(int(entry.name))
        except OSError:  # gone meanwhile
            pass
    return pids


def start_until_training(arguments: list[str], run: Path, cwd: Path) -> subprocess.Popen:
    """``memfit <arguments>`` started, once ``run`` logged a step more than it had."""
    steps = len(losses_by_step(read_metrics(run))) if (run / "metrics.jsonl").exists() else 0
    launcher = subprocess.Popen([*MEMFIT, *arguments], cwd=cwd, env=memfit_environment(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (run / "metrics.jsonl").exists() or \
            len(losses_by_step(read_metrics(run))) <= steps:
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
        time.sleep(0.05)
    return launcher


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_sigint_to_the_launcher_saves_and_sigkill_leaves_no_worker_behind(tmp_path: Path):
    config = config_file(tmp_path, "slow_regressor", max_steps=400)
    run = tmp_path / "slow_regressor"
    # SIGINT to the launcher alone, not to its process group: passed on, saved, 130.
    launcher = start_until_training(["train", str(config), "--nproc", "2"], run, tmp_path)
    os.kill(launcher.pid, signal.SIGINT)
    stderr = launcher.communicate(timeout=240)[1]
    assert launcher.returncode == 130, stderr
    line = stderr.strip().splitlines()
    assert len(line) == 1 and line[0].startswith("memfit: stopped by SIGINT after step "), stderr
    step = int(line[0].split("after step ")[1].split(";")[0])
    assert (run / "checkpoints" / f"step-{step}").is_dir()

    # SIGKILL to the launcher of the resumed job: its workers die with it.
    launcher = start_until_training(["train", "--resume", str(run), "--nproc", "2",
                                     "--trust-code"], run, tmp_path)
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 30
    while worker_pids(run):
        assert time.monotonic() < deadline, f"workers left running: {worker_pids(run)}"
        time.sleep(0.1)
    # The run resumes (here on one process, the same global batch) two steps past its newest
    # checkpoint.
    end = max(int(path.name.removeprefix("step-")) for path in run.glob("checkpoints/step-*")) + 2
    resumed = memfit("train", "--resume", str(run), f"train.max_steps={end}",
                     "distributed.nproc=1", "train.gradient_accumulation_steps=2",
                     "--trust-code", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(losses_by_step(read_metrics(run))) == list(range(1, end + 1))
