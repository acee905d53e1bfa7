"""Hugging Face Accelerate as the launcher: ``accelerate launch --multi_gpu --num_processes 2
-m memfit train ...`` starts 2 gloo workers through torchrun on this CPU, and they train and
resume under either strategy; without --multi_gpu (and no GPU to detect) accelerate starts
one process, which memfit refuses in one line. The model is a factory's regression: these
are tests of the launcher, and its workers start without importing transformers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dist_factories import regression_config
from dist_helpers import memfit_environment

from memfit.monitor.metrics import losses_by_step, read_metrics

pytestmark = pytest.mark.slow

# What the documented command passes; naming every value keeps accelerate from printing its
# "had defaults used instead" warning, and port 0 picks a free port (tests run side by side).
LAUNCH_FLAGS = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]

# The same launch written as an accelerate config file.
CONFIG_FILE = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
num_machines: 1
num_processes: 2
main_process_port: 0
mixed_precision: 'no'
"""


def accelerate_launch(accelerate_arguments: list[str], memfit_arguments: list[str],
                      cwd: Path) -> subprocess.CompletedProcess:
    # HF_HOME in tmp: a default config in the developer's own cache would change the launch.
    env = dict(memfit_environment(), HF_HOME=str(cwd / "hf-home"))
    # What the `accelerate` console script runs, with this interpreter.
    command = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch",
               *accelerate_arguments, "-m", "memfit", *memfit_arguments]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_trains_with_flags_and_resumes_with_a_config_file(tmp_path: Path, strategy: str):
    config = regression_config(tmp_path, "run", strategy, gradient_accumulation_steps=2,
                               save_every=2)
    first = accelerate_launch(LAUNCH_FLAGS, ["train", str(config)], cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    run = tmp_path / "run"
    before = losses_by_step(read_metrics(run))
    assert list(before) == [1, 2]

    accelerate_config = tmp_path / "accelerate.yaml"
    accelerate_config.write_text(CONFIG_FILE)
    resumed = accelerate_launch(["--config_file", str(accelerate_config)],
                                ["train", "--trust-code", "--resume", str(run),
                                 "train.max_steps=4"],
                                cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    after = losses_by_step(read_metrics(run))
    # Steps 3 and 4 follow the first run's (logged once, by rank 0), which stay as they were.
    assert list(after) == [1, 2, 3, 4]
    assert {step: after[step] for step in before} == before
    assert all(math.isfinite(loss) for loss in after.values())
    checkpoint = run / "checkpoints" / "step-4"
    assert {"rng-0.pt", "rng-1.pt"} <= {path.name for path in checkpoint.iterdir()}
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    # 4 steps x 2 processes x micro-batch 2 x accumulation 2: both runs had 2 workers.
    assert (state["step"], state["consumed"]) == (4, 32)


@pytest.mark.skipif(torch.cuda.device_count() > 1,
                    reason="accelerate turns on --multi_gpu itself when it sees several GPUs")
def test_without_multi_gpu_one_process_is_refused_in_one_line(tmp_path: Path):
    config = regression_config(tmp_path, "run", "fsdp", gradient_accumulation_steps=2,
                               save_every=2)
    result = accelerate_launch(["--num_processes", "2"], ["train", str(config)], cwd=tmp_path)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("memfit: error:")]
    assert len(errors) == 1 and "--multi_gpu" in errors[0], result.stderr
    assert not (tmp_path / "run").exists()
