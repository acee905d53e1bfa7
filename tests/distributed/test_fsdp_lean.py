"""FSDP2 with the optimizers and techniques that save memory: 8-bit AdamW, Adafactor,
GaLore, layer-wise updates and host offload, each accumulating 2 micro-batches per step,
on 2 gloo processes:

- the losses equal one unsharded process on the same global batch;
- a checkpoint written by 2 processes resumes on 1, and one written by 1 FSDP process
  resumes on 2, continuing as the uninterrupted run;
- each rank holds its rows of the optimizer state: the ranks' state bytes (counted by the
  tensor tracker) sum to one process's plus the state every rank keeps whole (GaLore's P
  and the R moments of a wide weight, Adafactor's column statistics, the step counters);
  8-bit AdamW quantizes each rank's rows on their own.

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

from memfit.monitor.metrics import losses_by_step, read_metrics
from memfit.techniques.optimizers.adamw8bit import BNB_MIN_8BIT_SIZE, QUANT_BLOCK
from memfit.training.api import train

pytestmark = pytest.mark.slow

STEPS = 4
GALORE = {"name": "galore", "galore": {"projector": "randomized_svd", "rank": 4,
                                       "update_gap": 2}}
CASES = {
    "adamw8bit": {"optimizer": {"name": "adamw8bit"}},
    "adafactor": {"optimizer": {"name": "adafactor"}},
    "galore": {"optimizer": GALORE},
    "layerwise-adamw": {"optimizer": {"layerwise": True}},
    "layerwise-galore": {"optimizer": {**GALORE, "layerwise": True}},
    "adamw-offloaded": {"memory": {"optimizer_offload": True}},
}
# Measured (relative loss differences over 4 steps): fp32 cases at most 4e-6 (GaLore's
# randomized SVD of a gradient summed in another order), 8-bit AdamW 1e-6; 1e-4 leaves
# room for a moment moving to the next 8-bit code (each rank's blocks start at its rows).
TOLERANCE = 1e-4


def _config(root: Path, name: str, data: Path, processes: int, case: dict,
            strategy: str) -> Path:
    return run_config(root, name, data, **case,
                      train={"max_steps": STEPS, "micro_batch_size": 8 // (2 * processes),
                             "keep_checkpoints": 2},
                      distributed={"strategy": strategy})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fsdp-lean")
    data = write_text_rows(root / "rows.jsonl")
    jobs = []
    for name, case in CASES.items():
        single = _config(root, f"{name}-single", data, 1, case, "none")
        train(single)
        write_state(str(single), 3, root / f"{name}-single-state")
        train(_config(root, f"{name}-fsdp1", data, 1, case, "fsdp"))
        jobs.append({"train": str(_config(root, f"{name}-2", data, 2, case, "fsdp"))})
        jobs.append({"state": str(root / f"{name}-2.yaml"), "steps": 3,
                     "out": str(root / f"{name}-2-state")})
        copy, config = interrupted_copy(root, f"{name}-fsdp1", 2, STEPS, global_batch=4)
        jobs.append({"train": str(config), "resume": str(copy)})
    (root / "jobs.json").write_text(json.dumps(jobs))
    job = on_two_processes("ddp_jobs.py", str(root / "jobs.json"), cwd=root)
    assert job.returncode == 0, job.stderr[-4000:]
    for name in CASES:
        copy, config = interrupted_copy(root, f"{name}-2", 1, STEPS, global_batch=4)
        train(config, resume=copy)
    return root


def _losses(run: Path) -> dict[int, float]:
    return losses_by_step(read_metrics(run))


# The 2-process losses pinned to the digits printed on 2026-12-02 (torch 2.13.0, CPU), the
# fsdp half of tests/regression/test_pinned_losses.py.
PINNED = {
    "galore": [5.554708, 5.493950, 5.407776, 5.331864],
    "layerwise-adamw": [5.554708, 5.410375, 5.231958, 5.138332],
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_two_process_losses_are_the_pinned_ones(runs: Path, name: str):
    assert list(_losses(runs / f"{name}-2").values()) == pytest.approx(PINNED[name], rel=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_two_processes_match_one_on_the_same_global_batch(runs: Path, name: str):
    single = _losses(runs / f"{name}-single")
    assert sorted(single) == list(range(1, STEPS + 1))
    assert _losses(runs / f"{name}-2") == pytest.approx(single, rel=TOLERANCE)
    assert _losses(runs / f"{name}-fsdp1") == pytest.approx(single, rel=TOLERANCE)


@pytest.mark.parametrize("name", list(CASES))
def test_a_two_process_checkpoint_resumes_on_one(runs: Path, name: str):
    uninterrupted = _losses(runs / f"{name}-2")
    resumed = _losses(runs / f"{name}-2-resumed-on-1")
    assert resumed == pytest.approx({step: uninterrupted[step] for step in (3, 4)}, rel=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_a_one_process_checkpoint_resumes_on_two(runs: Path, name: str):
    uninterrupted = _losses(runs / f"{name}-fsdp1")
    resumed = _losses(runs / f"{name}-fsdp1-resumed-on-2")
    assert resumed == pytest.approx({step: uninterrupted[step] for step in (3, 4)}, rel=1e-5)


def _state(runs: Path, name: str, rank: int | None) -> dict[str, torch.Tensor]:
    file = "rank-0.safetensors" if rank is None else f"rank-{rank}.safetensors"
    folder = f"{name}-single-state" if rank is None else f"{name}-2-state"
    return load_file(runs / folder / file)


@pytest.mark.parametrize("name", [name for name in CASES if name != "adamw8bit"])
def test_each_rank_holds_its_rows_of_the_optimizer_state(runs: Path, name: str):
    single = _state(runs, name, None)
    ranks = [_state(runs, name, rank) for rank in (0, 1)]
    replicated = int(ranks[0]["replicated_bytes"])
    assert replicated == int(ranks[1]["replicated_bytes"]) > 0
    # What every rank keeps whole is counted once per rank; the rest divides exactly.
    assert sum(int(rank["optimizer_bytes"]) for rank in ranks) == \
        int(single["optimizer_bytes"]) + replicated
    assert int(ranks[0]["optimizer_bytes"]) < int(single["optimizer_bytes"])


def _eight_bit_bytes(numel: int) -> int:
    """bitsandbytes' 8-bit AdamW state of one tensor: two fp32 moments under 4096 values,
    else two uint8 moments and one fp32 scale per block of 256 each."""
    if numel < BNB_MIN_8BIT_SIZE:
        return 8 * numel
    return 2 * numel + 2 * 4 * -(-numel // QUANT_BLOCK)


def test_eight_bit_state_quantizes_each_ranks_rows(runs: Path):
    codebooks = 2 * 256 * 4  # the signed and unsigned maps, shared by every parameter
    for state in [_state(runs, "adamw8bit", None)] + [_state(runs, "adamw8bit", rank)
                                                      for rank in (0, 1)]:
        weights = [tensor for key, tensor in state.items() if key.startswith("weight/")]
        assert int(state["optimizer_bytes"]) == codebooks + sum(
            _eight_bit_bytes(weight.numel()) for weight in weights)
