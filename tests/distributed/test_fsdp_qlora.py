"""QLoRA under FSDP2 with the quantized base sharded (techniques/quantized_shards.py), on
2 gloo processes, fp32 so that sharding alone is compared:

- NF4 (double quantized) and int8 bases, and NF4 with FSDP2's host offload
  (memory.optimizer_offload: CPUOffloadPolicy): the losses equal one unsharded process
  on the same global batch (the gathered codes and scales are bitsandbytes' own);
- a checkpoint written by 2 processes resumes on 1, one written by 1 FSDP process
  resumes on 2, each continuing as the uninterrupted run;
- ``memfit merge`` of the 2-process run equals the merge of the one-process run;
- each rank holds half of the quantized layers' bytes (codes and scales, counted by the
  tensor tracker).

The 2-process work runs in ONE torchrun job (ddp_jobs.py); the 1-process runs in this
process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ddp_jobs import write_state
from dist_helpers import interrupted_copy, on_two_processes, run_config, write_text_rows
from safetensors.torch import load_file

from memfit.merge import merge_run
from memfit.monitor.metrics import losses_by_step, read_metrics
from memfit.training.api import train

pytestmark = pytest.mark.slow

STEPS = 4
QUANTIZED_LAYERS = 14  # the tiny Llama's 7 linear layers in each of its 2 blocks
CASES = {"nf4": {"quantization": "nf4", "double_quant": True},
         "int8": {"quantization": "int8"}}


def _config(root: Path, name: str, data: Path, processes: int, case: str,
            strategy: str, **memory: bool) -> Path:
    return run_config(root, name, data, memory=memory,
                      adapter={"kind": "qlora", "rank": 4, **CASES[case]},
                      train={"max_steps": STEPS, "micro_batch_size": 8 // (2 * processes),
                             "keep_checkpoints": 2},
                      distributed={"strategy": strategy})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fsdp-qlora")
    data = write_text_rows(root / "rows.jsonl")
    jobs = []
    for case in CASES:
        train(_config(root, f"{case}-single", data, 1, case, "none"))
        jobs.append({"train": str(_config(root, f"{case}-2", data, 2, case, "fsdp"))})
    jobs.append({"train": str(_config(root, "nf4-offload-2", data, 2, "nf4", "fsdp",
                                      optimizer_offload=True))})
    single = _config(root, "nf4-state-single", data, 1, "nf4", "none")
    write_state(str(single), 1, root / "nf4-single-state")
    jobs.append({"state": str(_config(root, "nf4-state-2", data, 2, "nf4", "fsdp")),
                 "steps": 1, "out": str(root / "nf4-2-state")})
    train(_config(root, "nf4-fsdp1", data, 1, "nf4", "fsdp"))
    copy, config = interrupted_copy(root, "nf4-fsdp1", 2, STEPS, global_batch=4)
    jobs.append({"train": str(config), "resume": str(copy)})
    (root / "jobs.json").write_text(json.dumps(jobs))
    job = on_two_processes("ddp_jobs.py", str(root / "jobs.json"), cwd=root)
    assert job.returncode == 0, job.stderr[-4000:]
    copy, config = interrupted_copy(root, "nf4-2", 1, STEPS, global_batch=4)
    train(config, resume=copy)
    for run in ("nf4-single", "nf4-2"):
        merge_run(root / run, root / f"{run}-merged")
    return root


def _losses(run: Path) -> dict[int, float]:
    return losses_by_step(read_metrics(run))


@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_match_one_on_the_same_global_batch(runs: Path, case: str):
    single = _losses(runs / f"{case}-single")
    assert sorted(single) == list(range(1, STEPS + 1))
    assert _losses(runs / f"{case}-2") == pytest.approx(single, rel=1e-5)
    if case == "nf4":
        assert _losses(runs / "nf4-offload-2") == pytest.approx(single, rel=1e-5)


def test_a_two_process_checkpoint_resumes_on_one(runs: Path):
    uninterrupted = _losses(runs / "nf4-2")
    resumed = _losses(runs / "nf4-2-resumed-on-1")
    assert resumed == pytest.approx({step: uninterrupted[step] for step in (3, 4)}, rel=1e-5)


def test_a_one_process_checkpoint_resumes_on_two(runs: Path):
    assert _losses(runs / "nf4-fsdp1") == pytest.approx(_losses(runs / "nf4-single"),
                                                        rel=1e-5)
    uninterrupted = _losses(runs / "nf4-fsdp1")
    resumed = _losses(runs / "nf4-fsdp1-resumed-on-2")
    assert resumed == pytest.approx({step: uninterrupted[step] for step in (3, 4)}, rel=1e-5)


def test_merge_of_the_sharded_run_equals_the_one_process_merge(runs: Path):
    merged = [load_file(runs / f"{run}-merged" / "model.safetensors")
              for run in ("nf4-single", "nf4-2")]
    assert set(merged[0]) == set(merged[1])
    for name in merged[0]:
        torch.testing.assert_close(merged[1][name], merged[0][name], rtol=1e-4, atol=1e-6)


def test_each_rank_holds_half_of_the_quantized_base(runs: Path):
    single = int(load_file(runs / "nf4-single-state" / "rank-0.safetensors")
                 ["quantized_bytes"])
    ranks = [int(load_file(runs / "nf4-2-state" / f"rank-{rank}.safetensors")
                 ["quantized_bytes"]) for rank in (0, 1)]
    # Measured: 62864 bytes on one process, 31432 on each of 2. FSDP2 pads a layer's byte
    # string to a multiple of 2 rows: at most 1 byte per layer (7 per block, 2 blocks).
    assert ranks[0] == ranks[1]
    assert single <= sum(ranks) <= single + QUANTIZED_LAYERS
