"""LoRA and QLoRA under FSDP2 (bf16 mixed precision; the adapters and the 4-bit base
sharded) track a single-process run on the same global batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dist_helpers import memfit, run_config, write_text_rows
from safetensors.torch import load_file

from memfit.monitor.metrics import losses_by_step, read_metrics

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", ["lora", "qlora"])
def test_adapters_on_two_processes_track_one(tmp_path: Path, kind: str):
    data = write_text_rows(tmp_path / "rows.jsonl")
    common = {"adapter": {"kind": kind, "rank": 4}, "precision": "bf16"}
    short = {"save_every": 0, "max_steps": 2}
    single = memfit("train", str(run_config(
        tmp_path, "single", data, **common, train={"micro_batch_size": 4, **short})),
        cwd=tmp_path)
    assert single.returncode == 0, single.stderr
    sharded = memfit("train", str(run_config(
        tmp_path, "sharded", data, **common, train={"micro_batch_size": 2, **short},
        distributed={"strategy": "fsdp"})), "--nproc", "2", cwd=tmp_path)
    assert sharded.returncode == 0, sharded.stderr
    # bf16: the all-gathered weights are bf16 where autocast would cast per op.
    assert losses_by_step(read_metrics(tmp_path / "sharded")) == pytest.approx(
        losses_by_step(read_metrics(tmp_path / "single")), rel=2e-3)
    adapters = [load_file(tmp_path / run / "adapter" / "adapter_model.safetensors")
                for run in ("single", "sharded")]
    assert set(adapters[0]) == set(adapters[1])
    for name in adapters[0]:
        torch.testing.assert_close(adapters[1][name], adapters[0][name], rtol=0.05, atol=2e-3)
