"""Sequence parallelism on 4 gloo processes in 2 sequence groups of 2: the losses of DDP
over the groups, and of FSDP2 sharding over all 4, equal one process reading both groups'
examples (rel 1e-5, fp32); the all-to-all attention in one group of 4 and in two groups of
2 equals SDPA on the whole sequence. One torchrun job (ddp_jobs.py) for the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dist_helpers import on_two_processes, write_text_rows
from sequence_cases import STEPS, case_config

from memfit.monitor.metrics import losses_by_step, read_metrics
from memfit.training.api import train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def four_processes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 processes in 2 sequence groups of 2 (DDP, and FSDP2 sharding over all 4), against
    one process reading both groups' examples (a micro-batch of 6), and the attention in
    one group of 4 and in two groups of 2."""
    root = tmp_path_factory.mktemp("sequence-parallel-4")
    data = write_text_rows(root / "rows.jsonl")
    jobs: list[dict] = [{"sequence_attention": 4}, {"sequence_attention": 2}]
    for case in ("lora", "full-fsdp"):
        train(case_config(root, f"{case}-single", data, case, 1, micro_batch_size=6))
        jobs.append({"train": str(case_config(root, f"{case}-sp2", data, case, 2))})
    (root / "jobs.json").write_text(json.dumps(jobs))
    job = on_two_processes("ddp_jobs.py", str(root / "jobs.json"), cwd=root, nproc=4)
    assert job.returncode == 0, job.stderr[-4000:]
    return root


@pytest.mark.parametrize("case", ["lora", "full-fsdp"])
def test_two_sequence_groups_of_two_train_as_one_process(four_processes: Path,
                                                         case: str) -> None:
    single = losses_by_step(read_metrics(four_processes / f"{case}-single"))
    split = losses_by_step(read_metrics(four_processes / f"{case}-sp2"))
    assert sorted(split) == list(range(1, STEPS + 1))
    assert split == pytest.approx(single, rel=1e-5)

