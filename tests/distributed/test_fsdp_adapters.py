"""LoRA and QLoRA under FSDP2 (bf16 mixed precision; the adapters and the 4-bit base
sharded) track a single-process run on the same global batch.

The two 2-process runs share ONE torchrun job (ddp_jobs.py); the 1-process runs run in
this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dist_helpers import on_two_processes, run_config, write_text_rows
from safetensors.torch import load_file

from memfit.monitor.metrics import losses_by_step, read_metrics
from memfit.training.api import train

pytestmark = pytest.mark.slow

KINDS = ("lora", "qlora")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fsdp-adapters")
    data = write_text_rows(root / "rows.jsonl")
    short = {"save_every": 0, "max_steps": 2}
    jobs = []
    for kind in KINDS:
        common = {"adapter": {"kind": kind, "rank": 4}, "precision": "bf16"}
        train(run_config(root, f"{kind}-single", data, **common,
                         train={"micro_batch_size": 4, **short}))
        jobs.append({"train": str(run_config(
            root, f"{kind}-sharded", data, **common, train={"micro_batch_size": 2, **short},
            distributed={"strategy": "fsdp"}))})
    (root / "jobs.json").write_text(json.dumps(jobs))
    job = on_two_processes("ddp_jobs.py", str(root / "jobs.json"), cwd=root)
    assert job.returncode == 0, job.stderr[-4000:]
    return root


@pytest.mark.parametrize("kind", KINDS)
def test_adapters_on_two_processes_track_one(runs: Path, kind: str):
    single, sharded = runs / f"{kind}-single", runs / f"{kind}-sharded"
    # bf16: the all-gathered weights are bf16 where autocast would cast per op.
    assert losses_by_step(read_metrics(sharded)) == pytest.approx(
        losses_by_step(read_metrics(single)), rel=2e-3)
    assert sorted(losses_by_step(read_metrics(sharded))) == [1, 2]
    adapters = [load_file(run / "adapter" / "adapter_model.safetensors")
                for run in (single, sharded)]
    assert set(adapters[0]) == set(adapters[1])
    for name in adapters[0]:
        torch.testing.assert_close(adapters[1][name], adapters[0][name], rtol=0.05, atol=2e-3)
