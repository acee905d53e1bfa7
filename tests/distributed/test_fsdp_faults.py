"""Faults on one rank of an FSDP job: every rank reaches the same decision at the same
step (a nan loss on rank 1 stops both; a SIGTERM to rank 1 makes both save that step and
stop), instead of one rank waiting forever in a collective. The subprocess timeouts only
guard against such a hang."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dist_helpers import memfit

from memfit.monitor.metrics import losses_by_step, read_metrics

pytestmark = pytest.mark.slow


def config_file(tmp_path: Path, factory: str) -> Path:
    generator = np.random.default_rng(0)
    np.savez(tmp_path / "rows.npz", inputs=generator.normal(size=(32, 8)).astype(np.float32),
             targets=generator.normal(size=(32, 1)).astype(np.float32))
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {{factory: 'fault_factories:{factory}', task: custom}}\n"
        f"data: {{path: {tmp_path / 'rows.npz'}, format: tensors, eval_fraction: 0}}\n"
        f"train: {{output_dir: {tmp_path / 'run'}, max_steps: 6, micro_batch_size: 2, "
        "save_every: 2}\n"
        "distributed: {strategy: fsdp}\n"
        "log: {progress: false, tensorboard: false}\n")
    return config


def lines_from_both_ranks(stderr: str, start: str) -> list[str]:
    found = [line for line in stderr.splitlines() if line.startswith(start)]
    assert len(found) == 2, stderr
    return found


def test_a_nan_loss_on_one_rank_stops_every_rank_at_that_step(tmp_path: Path):
    run = tmp_path / "run"
    result = memfit("train", str(config_file(tmp_path, "nan_on_rank_one")), "--nproc", "2",
                    cwd=tmp_path, timeout=240)
    assert result.returncode != 0
    for line in lines_from_both_ranks(result.stderr, "memfit: error: loss became nan"):
        assert line.startswith("memfit: error: loss became nan at step 3; last finite "
                               f"checkpoint: {run}/checkpoints/step-2; ")
    assert sorted(path.name for path in run.glob("checkpoints/step-*")) == ["step-2"]
    assert not (run / "summary.json").exists()


def test_sigterm_to_one_rank_saves_that_step_on_every_rank_then_resumes(tmp_path: Path):
    run = tmp_path / "run"
    stopped = memfit("train", str(config_file(tmp_path, "sigterm_on_rank_one")), "--nproc", "2",
                     cwd=tmp_path, timeout=240)
    assert stopped.returncode != 0
    assert set(lines_from_both_ranks(stopped.stderr, "memfit: stopped by")) == {
        f"memfit: stopped by SIGTERM after step 3; checkpoint saved: {run}/checkpoints/step-3; "
        f"resume with: memfit train --resume {run}"}
    assert (run / "checkpoints" / "step-3").is_dir()

    resumed = memfit("train", "--resume", str(run), cwd=tmp_path, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(losses_by_step(read_metrics(run))) == [1, 2, 3, 4, 5, 6]
    assert (run / "summary.json").is_file()
