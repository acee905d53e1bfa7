"""FSDP2 on 2 gloo processes equals one process on the same global batch; its sharded
checkpoints resume on 2 processes and on 1; ``memfit merge`` consolidates them.

The 2-process runs are the real CLI (``memfit train --nproc 2``); the 1-process runs and
the merge run in this process, as ``memfit train`` and ``memfit merge`` run them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from dist_helpers import memfit, run_config, write_text_rows
from safetensors.torch import load_file

from memfit.merge import merge_run
from memfit.monitor.metrics import losses_by_step, read_metrics
from memfit.techniques.config_checks import load_config
from memfit.training.api import train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Full fine-tuning with accumulation and clipping: one process with micro-batch 4,
    and 2 processes with micro-batch 2 each (the same 8 examples per step) and the chunked
    loss (run as the root unit's forward method: called around it, the decoder found the
    root's embeddings sharded)."""
    root = tmp_path_factory.mktemp("fsdp")
    data = write_text_rows(root / "rows.jsonl")
    train(run_config(root, "single", data, train={"micro_batch_size": 4}))
    sharded = memfit("train", str(run_config(root, "sharded", data,
                                             train={"micro_batch_size": 2},
                                             memory={"chunked_loss": True},
                                             distributed={"strategy": "fsdp"})),
                     "--nproc", "2", cwd=root)
    assert sharded.returncode == 0, sharded.stderr
    return root


def _assert_same_run(run: Path, reference: Path, steps: list[int]) -> None:
    losses = losses_by_step(read_metrics(reference))
    assert losses_by_step(read_metrics(run)) == pytest.approx(
        {step: losses[step] for step in steps}, rel=1e-5)
    final, again = (load_file(r / "model" / "model.safetensors") for r in (reference, run))
    for name in final:
        if name in again:  # a gathered export also writes the tied lm_head.weight
            torch.testing.assert_close(again[name], final[name], rtol=1e-4, atol=1e-6)


def test_two_processes_match_one_on_the_same_global_batch(runs: Path):
    single, sharded = runs / "single", runs / "sharded"
    _assert_same_run(sharded, single, [1, 2, 3, 4])
    assert losses_by_step(read_metrics(sharded), "eval_loss") == pytest.approx(
        losses_by_step(read_metrics(single), "eval_loss"), rel=1e-5)
    records = read_metrics(sharded)  # rank 0 alone logs: each step once
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]
    checkpoint = sharded / "checkpoints" / "step-4"
    assert {".metadata", "rng-0.pt", "rng-1.pt", "trainer_state.json"} <= {
        path.name for path in checkpoint.iterdir()}
    assert not (checkpoint / "trainable.safetensors").exists()


# The 2-process losses pinned to the digits printed on 2026-12-02 (torch 2.13.0, CPU), the
# fsdp half of tests/regression/test_pinned_losses.py.
PINNED = [5.554708, 5.410375, 5.231967, 5.137455]


def test_the_two_process_losses_are_the_pinned_ones(runs: Path):
    losses = losses_by_step(read_metrics(runs / "sharded"))
    assert list(losses.values()) == pytest.approx(PINNED, rel=1e-5)


def _interrupted_copy(runs: Path, name: str) -> Path:
    """The 2-process run as if it had stopped after its step-2 checkpoint."""
    copy = runs / name
    shutil.copytree(runs / "sharded", copy)
    shutil.rmtree(copy / "checkpoints" / "step-4")
    (copy / "metrics.jsonl").write_text("")
    return copy


def test_resume_on_two_processes_matches_uninterrupted(runs: Path):
    resumed = _interrupted_copy(runs, "resumed-2")
    result = memfit("train", "--resume", str(resumed), "--nproc", "2", cwd=runs)
    assert result.returncode == 0, result.stderr
    _assert_same_run(resumed, runs / "sharded", [3, 4])


def _resume_here(resumed: Path, *overrides: str) -> None:
    """``memfit train --resume RESUMED OVERRIDES...``, in this process."""
    train(load_config(resumed / "config.yaml", list(overrides)), resume=resumed)


def test_resume_on_one_process_from_a_two_process_checkpoint(runs: Path):
    resumed = _interrupted_copy(runs, "resumed-1")
    # One process reads the same 8 examples per step with a micro-batch of 4.
    _resume_here(resumed, "distributed.nproc=1", "train.micro_batch_size=4")
    _assert_same_run(resumed, runs / "sharded", [3, 4])


def test_resume_without_fsdp_from_a_two_process_checkpoint(runs: Path):
    """DCP reshards the checkpoint into one unsharded model (distributed.strategy=none)."""
    resumed = _interrupted_copy(runs, "resumed-plain")
    _resume_here(resumed, "distributed.strategy=none", "distributed.nproc=1",
                 "train.micro_batch_size=4")
    _assert_same_run(resumed, runs / "sharded", [3, 4])


def test_merge_consolidates_the_newest_sharded_checkpoint(runs: Path):
    merge_run(runs / "sharded", runs / "merged")
    merged = load_file(runs / "merged" / "model.safetensors")
    exported = load_file(runs / "sharded" / "model" / "model.safetensors")
    assert set(merged) <= set(exported)
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, exported[name], rtol=0, atol=0)
