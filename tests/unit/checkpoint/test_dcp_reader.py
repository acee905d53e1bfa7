"""A sharded checkpoint is read by DCP with nothing in it run as code: real DCP files
(written in one process, no process group) with planted pickles in the places DCP's own
reader unpickles — the .metadata file and the non-tensor items."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict

from memfit._utils.errors import CheckpointError
from memfit.checkpoint import load_checkpoint, save_checkpoint
from memfit.checkpoint import sharded as sharded_checkpoint
from memfit.checkpoint.manifest import MANIFEST_FILE, CheckpointKind, write_manifest
from memfit.checkpoint.state import TrainerState


class Plant:
    """Unpickling it creates ``marker``: proof that a file ran code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _training(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def _sharded(run_dir: Path, model: nn.Module, optimizer, scheduler, dcp_state=None) -> Path:
    """A checkpoint laid out as an FSDP2 run on one rank writes it (the files of a
    single-process save, with the weights and optimizer state through DCP instead)."""
    folder = save_checkpoint(run_dir, TrainerState(step=2), model, optimizer, scheduler,
                             None, keep=2)
    for name in ("trainable.safetensors", "buffers.safetensors", "optimizer.pt"):
        (folder / name).unlink()
    (folder / "rng.pt").rename(folder / "rng-0.pt")
    if dcp_state is None:
        sharded_checkpoint.save(folder, model, optimizer)
    else:
        dcp.save(dcp_state, checkpoint_id=folder)
    _reseal(folder, CheckpointKind.SHARDED)
    return folder


def _reseal(folder: Path, kind: CheckpointKind) -> None:
    """What someone who plants a file does too: a manifest matching the folder."""
    (folder / MANIFEST_FILE).unlink()
    write_manifest(folder, kind, 2)


def test_a_sharded_checkpoint_resumes_a_plain_model(tmp_path: Path):
    model, optimizer, scheduler = _training()
    folder = _sharded(tmp_path, model, optimizer, scheduler)
    again, again_optimizer, again_scheduler = _training(seed=1)
    state = load_checkpoint(folder, again, again_optimizer, again_scheduler, None)
    assert state.step == 2
    for expected, loaded in zip(model.parameters(), again.parameters(), strict=True):
        torch.testing.assert_close(loaded, expected, rtol=0, atol=0)
    torch.testing.assert_close(again_optimizer.state_dict()["state"][0]["exp_avg"],
                               optimizer.state_dict()["state"][0]["exp_avg"], rtol=0, atol=0)


def test_a_planted_metadata_pickle_is_refused_in_one_line(tmp_path: Path):
    marker = tmp_path / "ran"
    folder = _sharded(tmp_path, *_training())
    (folder / ".metadata").write_bytes(pickle.dumps(Plant(marker)))
    _reseal(folder, CheckpointKind.SHARDED)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(folder, *_training(), None)
    assert not marker.exists()
    message = str(caught.value)
    assert "\n" not in message and str(folder / ".metadata") in message
    assert "refused" in message and "io.open" in message


def test_a_planted_non_tensor_item_is_refused(tmp_path: Path):
    """DCP's planner reads the optimizer's param_groups values with weights_only=False."""
    marker = tmp_path / "ran"
    model, optimizer, scheduler = _training()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    optimizer_state["param_groups"][0]["lr"] = Plant(marker)
    folder = _sharded(tmp_path, model, optimizer, scheduler,
                      dcp_state={"model": model_state, "optimizer": optimizer_state})
    with pytest.raises(CheckpointError, match="param_groups.*refused") as caught:
        load_checkpoint(folder, *_training(), None)
    assert not marker.exists()
    assert "\n" not in str(caught.value)


def test_metadata_pointing_outside_the_folder_is_refused(tmp_path: Path):
    outside = tmp_path / "outside.distcp"
    folder = _sharded(tmp_path, *_training())
    metadata = pickle.loads((folder / ".metadata").read_bytes())  # our own file: trusted
    for info in metadata.storage_data.values():
        outside.write_bytes((folder / info.relative_path).read_bytes())
        info.relative_path = "../../outside.distcp"
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    _reseal(folder, CheckpointKind.SHARDED)
    with pytest.raises(CheckpointError, match="'../../outside.distcp', which is not a file"):
        load_checkpoint(folder, *_training(), None)


def test_a_single_process_checkpoint_is_never_read_through_dcp(tmp_path: Path):
    """The manifest's kind decides: a .metadata in a single-process checkpoint (even one
    the manifest lists) is never opened."""
    marker = tmp_path / "ran"
    model, optimizer, scheduler = _training()
    folder = save_checkpoint(tmp_path, TrainerState(step=2), model, optimizer, scheduler,
                             None, keep=2)
    (folder / ".metadata").write_bytes(pickle.dumps(Plant(marker)))
    _reseal(folder, CheckpointKind.SINGLE_PROCESS)
    again = _training(seed=1)
    assert load_checkpoint(folder, *again, None).step == 2
    assert not marker.exists()
    for expected, loaded in zip(model.parameters(), again[0].parameters(), strict=True):
        torch.testing.assert_close(loaded, expected, rtol=0, atol=0)


def test_merge_reads_a_sharded_checkpoint_only_once_verified_and_safely(tmp_path: Path):
    """``load_trainable`` (what ``memfit merge`` consolidates) refuses the same plant, and
    an unsealed change to the folder before reading anything."""
    marker = tmp_path / "ran"
    model, optimizer, scheduler = _training()
    folder = _sharded(tmp_path, model, optimizer, scheduler)
    plain = _training(seed=1)[0]
    sharded_checkpoint.load_trainable(folder, plain)
    for expected, loaded in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(loaded, expected, rtol=0, atol=0)

    (folder / ".metadata").write_bytes(pickle.dumps(Plant(marker)))
    with pytest.raises(CheckpointError, match=r"is damaged \(\.metadata: "):
        sharded_checkpoint.load_trainable(folder, plain)
    _reseal(folder, CheckpointKind.SHARDED)
    with pytest.raises(CheckpointError, match=r"\.metadata: refused"):
        sharded_checkpoint.load_trainable(folder, plain)
    assert not marker.exists()
