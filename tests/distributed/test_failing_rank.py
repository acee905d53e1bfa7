"""A rank that raises ends the whole job: non-zero exit, that rank's error shown, and the
other rank (blocked in a collective) stopped instead of waiting forever. The subprocess
timeout is only a guard against a hang, not a speed target."""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_factories import FAILURE, write_regression_rows
from dist_helpers import memfit

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_a_failing_rank_stops_the_job_with_its_error(tmp_path: Path, strategy: str):
    write_regression_rows(tmp_path / "rows.npz")
    config = tmp_path / "run.yaml"
    config.write_text(
        "model: {factory: 'dist_factories:fails_on_rank_one', task: custom}\n"
        f"data: {{path: {tmp_path / 'rows.npz'}, format: tensors, eval_fraction: 0}}\n"
        f"train: {{output_dir: {tmp_path / 'run'}, max_steps: 6, micro_batch_size: 2}}\n"
        f"distributed: {{strategy: {strategy}}}\n"
        "log: {progress: false, tensorboard: false}\n")
    result = memfit("train", str(config), "--nproc", "2", cwd=tmp_path, timeout=240)
    assert result.returncode == 1, result.stderr  # a bug, as in one process
    assert FAILURE in result.stderr  # with its traceback, the only one: rank 0, whose
    assert result.stderr.count("Traceback") == 1  # collective failed as a result, is quiet
    assert result.stderr.strip().splitlines()[-1] == ("memfit: error: worker rank 1 failed "
                                                      "with exit status 1 (its output is "
                                                      "above); the other workers were stopped")
    assert "ChildFailedError" not in result.stderr  # torchrun's own report is not shown
    assert not (tmp_path / "run" / "summary.json").exists()
