"""Data parallel (distributed.strategy=ddp) on 2 gloo processes equals one process on the
same global batch, for every optimizer, layer-wise updates and LoRA with checkpointing
and chunked loss, with gradient accumulation. Its checkpoints resume on 1 process from 2
and on 2 from 1; GaLore reduces its projected gradients (fewer bytes) and every rank
derives bitwise the same projector; an fp16 inf gradient on one rank is skipped by all.

All 2-process work runs in ONE torchrun job (ddp_jobs.py), so the cases share a start-up.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from dist_helpers import on_two_processes, run_config, write_text_rows
from pins import pinned
from safetensors.torch import load_file

from memfit.bench.random_llama import LlamaShape, llama_config, save_random_model
from memfit.checkpoint.manifest import CheckpointKind, read_manifest
from memfit.models.tokenizers import byte_level_tokenizer
from memfit.monitor.metrics import losses_by_step, read_metrics
from memfit.techniques.optimizers import SPECS
from memfit.training.api import train

pytestmark = pytest.mark.slow

STEPS = 5
GALORE = {"name": "galore", "galore": {"projector": "randomized_svd", "rank": 4,
                                       "update_gap": 2}}
# name -> the config sections it sets; every case accumulates 2 micro-batches per step.
CASES = {
    "adamw": {},
    "adamw8bit": {"optimizer": {"name": "adamw8bit"}},
    "adafactor": {"optimizer": {"name": "adafactor"}},
    "galore": {"optimizer": GALORE},
    "galore-online": {"optimizer": {"name": "galore",
                                    "galore": {"projector": "online", "rank": 4}}},
    "layerwise-adamw": {"optimizer": {"layerwise": True}},
    "layerwise-galore": {"optimizer": {**GALORE, "layerwise": True}},
    "lora-checkpointed-chunked": {"adapter": {"kind": "lora"},
                                  "memory": {"gradient_checkpointing": True,
                                             "chunked_loss": True}},
    "qlora-bf16-offloaded": {"adapter": {"kind": "qlora"}, "precision": "bf16",
                             "memory": {"optimizer_offload": True,
                                        "activation_offload": True}},
    # An untied input embedding: memfit sums only the rows the step's tokens touched.
    "untied-embedding": {"model": {"preset": None, "path": "{root}/untied"}},
    # Own keys (techniques/own_keys.py) under DDP: an optimizer's, and a technique's that
    # acts on some blocks only.
    "sgd-momentum": {"optimizer": {"name": "sgd", "momentum": 0.9}},
    "frozen-first-block": {"memory": {"freeze_blocks": 1}},
}
# Every other registered optimizer with its defaults (paged_adamw8bit pages GPU memory:
# CUDA only), so a new one is tested under DDP without editing this file.
CASES.update({name: {"optimizer": {"name": name}} for name in SPECS
              if name not in CASES and name != "paged_adamw8bit"})
UNTIED = LlamaShape(hidden=32, layers=2, heads=4, intermediate=64, vocab=512)
# 8-bit AdamW quantizes its moments in blocks; 2 processes sum the same gradients in
# another order, and a last-bit difference could move a moment to the next 8-bit code.
# Measured here: relative loss differences of at most 1.4e-7 over 5 steps (fp32 AdamW:
# 0.7e-7, online GaLore 1.5e-7); 1e-4 leaves room for such a code flip. QLoRA computes in
# bf16 (8 bits of mantissa), where another order of the same sums moved the loss by up to
# 2.8e-5 (measured); its steps change the loss by ~5e-3 each.
TOLERANCE = {"adamw8bit": 1e-4, "qlora-bf16-offloaded": 2e-4}


def _config(root: Path, name: str, data: Path, processes: int, case: dict,
            strategy: str = "ddp") -> Path:
    case = json.loads(json.dumps(case).replace("{root}", str(root)))
    return run_config(root, name, data, **case,
                      train={"max_steps": STEPS, "micro_batch_size": 8 // (2 * processes),
                             "keep_checkpoints": 3},
                      distributed={"strategy": strategy})  # torchrun says how many


def _fp16_config(root: Path) -> Path:
    generator = np.random.default_rng(0)
    np.savez(root / "rows.npz", inputs=generator.normal(size=(32, 8)).astype(np.float32),
             targets=generator.normal(size=(32, 1)).astype(np.float32))
    path = root / "fp16.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"factory": "dist_factories:inf_gradient_on_rank_one", "task": "custom"},
        "data": {"path": str(root / "rows.npz"), "format": "tensors", "eval_fraction": 0},
        "train": {"output_dir": str(root / "fp16"), "micro_batch_size": 2},
        "precision": "fp16", "distributed": {"strategy": "ddp", "nproc": 2}}))
    return path


def _resume_config(run: Path, processes: int) -> Path:
    """The run's own config.yaml on ``processes`` processes (the same global batch)."""
    mapping = yaml.safe_load((run / "config.yaml").read_text())
    mapping["train"]["micro_batch_size"] = 8 // (2 * processes)
    mapping["distributed"]["nproc"] = processes
    path = run.parent / f"{run.name}-on-{processes}.yaml"
    path.write_text(yaml.safe_dump(mapping))
    return path


def _interrupted_copy(root: Path, run: str, name: str, after: int = 2) -> Path:
    """``run`` as if it had stopped after its step-``after`` checkpoint."""
    copy = root / name
    shutil.copytree(root / run, copy)
    for later in range(after + 1, STEPS + 1):
        shutil.rmtree(copy / "checkpoints" / f"step-{later}", ignore_errors=True)
    (copy / "metrics.jsonl").write_text("")
    (copy / "summary.json").unlink()
    return copy


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process with micro-batch 4 (the reference; adamw's as a 1-process ddp run, the
    source of the 1 -> 2 resume) and 2 processes with micro-batch 2 each: the same 8
    examples per step, as 2 micro-batches."""
    root = tmp_path_factory.mktemp("ddp")
    data = write_text_rows(root / "rows.jsonl")
    save_random_model(root / "untied", llama_config(UNTIED), byte_level_tokenizer())
    jobs = []
    for name, case in CASES.items():
        train(_config(root, f"{name}-1", data, 1, case,
                      strategy="ddp" if name == "adamw" else "none"))
        jobs.append({"train": str(_config(root, f"{name}-2", data, 2, case))})
    for name in ("galore", "layerwise-galore"):
        jobs.append({"state": str(root / f"{name}-2.yaml"), "steps": 3,
                     "out": str(root / f"{name}-state")})
    jobs.append({"state": str(_fp16_config(root)), "steps": 3, "out": str(root / "fp16-state")})
    resumed = _interrupted_copy(root, "adamw-1", "resumed-1to2")
    jobs.append({"train": str(_resume_config(resumed, 2)), "resume": str(resumed)})
    (root / "jobs.json").write_text(json.dumps(jobs))
    job = on_two_processes("ddp_jobs.py", str(root / "jobs.json"), cwd=root)
    assert job.returncode == 0, job.stderr[-4000:]
    return root


def _losses(run: Path, key: str = "loss") -> dict[int, float]:
    return losses_by_step(read_metrics(run), key)


@pytest.mark.parametrize("name", list(CASES))
def test_two_processes_match_one_on_the_same_global_batch(runs: Path, name: str):
    one, two = runs / f"{name}-1", runs / f"{name}-2"
    tolerance = TOLERANCE.get(name, 1e-5)
    assert list(_losses(two)) == list(range(1, STEPS + 1))
    assert _losses(two) == pytest.approx(_losses(one), rel=tolerance)
    assert _losses(two, "eval_loss") == pytest.approx(_losses(one, "eval_loss"), rel=tolerance)


# The 2-process losses of every case, pinned to the digits printed on 2026-12-04 (torch
# 2.13.0, CPU; sgd-momentum, frozen-first-block and came on 2026-12-05): the ddp half of
# tests/regression/test_pinned_losses.py. A new case (a new registered optimizer) fails
# here until its losses are pinned.
PINNED = {
    "adafactor": [5.554708, 5.536993, 5.537203, 5.528737, 5.525222],
    "adamw": [5.554708, 5.410375, 5.231967, 5.125843, 5.077516],
    "adamw8bit": [5.554708, 5.410375, 5.231970, 5.125843, 5.077516],
    "came": [5.554708, 4.934911, 4.051274, 3.176834, 2.977616],
    "galore": [5.554708, 5.493950, 5.407758, 5.322160, 5.279629],
    "galore-online": [5.554708, 5.493950, 5.407722, 5.321243, 5.278802],
    "layerwise-adamw": [5.554708, 5.410375, 5.231958, 5.126802, 5.079314],
    "layerwise-galore": [5.554708, 5.493935, 5.407530, 5.322565, 5.279974],
    "lion": [5.554708, 5.410374, 5.218199, 5.094266, 5.037161],
    "lora-checkpointed-chunked": [5.554708, 5.525223, 5.501088, 5.473120, 5.459376],
    "qlora-bf16-offloaded": [5.547857, 5.517843, 5.494433, 5.467396, 5.454441],
    "sgd": [5.554708, 5.538682, 5.542473, 5.536781, 5.534457],
    "sgd-momentum": [5.554708, 5.538682, 5.539961, 5.530499, 5.524675],
    "frozen-first-block": [5.554708, 5.451477, 5.298029, 5.187111, 5.133865],
    "untied-embedding": [6.239900, 6.192564, 6.126115, 6.083881, 6.045330],
}
# Where an AVX2 machine's kernels print other digits (tests/pins.py): bitsandbytes
# quantizes the QLoRA base differently there.
PINNED_BY_CAPABILITY = {
    "AVX2": {"qlora-bf16-offloaded": [5.549268, 5.519479, 5.496098, 5.468932, 5.456213]},
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_two_process_losses_are_the_pinned_ones(runs: Path, name: str):
    assert name in PINNED, f"pin the 2-process losses of {name}"
    expected = pinned(name, PINNED, PINNED_BY_CAPABILITY)
    assert list(_losses(runs / f"{name}-2").values()) == pytest.approx(expected, rel=1e-5)


def test_checkpoints_are_written_once_with_every_ranks_generators(runs: Path):
    checkpoint = runs / "adamw-2" / "checkpoints" / f"step-{STEPS}"
    assert read_manifest(checkpoint).kind is CheckpointKind.SINGLE_PROCESS
    assert {"trainable.safetensors", "optimizer.pt", "rng-0.pt", "rng-1.pt"} <= {
        path.name for path in checkpoint.iterdir()}


def _allreduced(name: str, runs: Path) -> list[int]:
    return [r["allreduce_bytes"] for r in read_metrics(runs / f"{name}-2") if "loss" in r]


def test_galore_reduces_projected_gradients_on_steps_that_keep_its_projector(runs: Path):
    full = _allreduced("adamw", runs)
    assert len(set(full)) == 1  # every step reduces every gradient once
    # update_gap=2: steps 1, 3, 5 refresh P from the full gradient; 2 and 4 keep P.
    galore = _allreduced("galore", runs)
    assert galore[0::2] == full[0::2]
    assert all(keep < full[0] / 2 for keep in galore[1::2])
    layerwise = _allreduced("layerwise-galore", runs)
    assert layerwise[1::2] == galore[1::2]


def _state_of_both_ranks(folder: Path) -> tuple[dict, dict]:
    first, second = (load_file(folder / f"rank-{rank}.safetensors") for rank in (0, 1))
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key
    return first, second


def test_an_untied_embedding_sums_only_its_touched_rows(runs: Path):
    weights = load_file(runs / "untied-embedding-2" / "model" / "model.safetensors")
    dense = sum(tensor.numel() * 4 for tensor in weights.values())
    table = weights["model.embed_tokens.weight"].numel() * 4
    # The byte-level texts touch about 20 of the 512 rows (measured: 21).
    assert all(dense - table < sent < dense - table / 2
               for sent in _allreduced("untied-embedding", runs))


@pytest.mark.parametrize("name", ["galore", "layerwise-galore"])
def test_every_rank_derives_bitwise_the_same_projector(runs: Path, name: str):
    first, _ = _state_of_both_ranks(runs / f"{name}-state")
    assert any(key.startswith("projector/") for key in first)


def test_an_inf_gradient_on_one_rank_is_skipped_by_every_rank(runs: Path):
    """fp16: rank 1's gradient overflows in step 2; the summed gradients are inf on both
    ranks, so both scalers skip that step and halve the scale, and the weights stay
    equal. (Step 1 overflows at the initial scale 2^16 on any number of processes — one
    process, measured: grad_norm inf at step 1, finite at steps 2 and 3 — so two skips.)"""
    first, _ = _state_of_both_ranks(runs / "fp16-state")
    assert float(first["scale"]) == 2.0 ** 16 / 4


def test_a_one_process_checkpoint_resumes_on_two(runs: Path):
    assert _losses(runs / "resumed-1to2") == pytest.approx(
        {step: _losses(runs / "adamw-1")[step] for step in range(3, STEPS + 1)}, rel=1e-5)


def test_a_launched_run_records_its_processes(runs: Path):
    """Started by torchrun with distributed.nproc left at 1: config.yaml says 2, so a
    resume on one process knows the global batch (checked by the next test)."""
    assert yaml.safe_load((runs / "adamw-2" / "config.yaml").read_text())[
        "distributed"]["nproc"] == 2


def test_a_two_process_checkpoint_resumes_on_one(runs: Path):
    resumed = _interrupted_copy(runs, "adamw-2", "resumed-2to1")
    train(_resume_config(resumed, 1), resume=resumed)
    assert _losses(resumed) == pytest.approx(
        {step: _losses(runs / "adamw-2")[step] for step in range(3, STEPS + 1)}, rel=1e-5)


class _Plant:
    """Unpickling it creates ``marker``: proof that a file from the run folder ran code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_rank_file_planted_in_a_checkpoint_never_runs_and_resume_falls_back(runs: Path):
    """rng-1.pt of the newest 2-process checkpoint replaced by a pickle that would run code:
    the checkpoint no longer matches its manifest, so a resume on one process takes the
    one before it and trains the same steps as the uninterrupted run."""
    resumed, marker = _interrupted_copy(runs, "adamw-2", "planted", after=4), runs / "ran"
    (resumed / "checkpoints" / "step-4" / "rng-1.pt").write_bytes(
        pickle.dumps(_Plant(marker)))
    train(_resume_config(resumed, 1), resume=resumed)
    assert not marker.exists()
    assert _losses(resumed) == pytest.approx(
        {step: _losses(runs / "adamw-2")[step] for step in range(3, STEPS + 1)}, rel=1e-5)
