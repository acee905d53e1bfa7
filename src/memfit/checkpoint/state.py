"""A checkpoint is a folder ``checkpoints/step-N/`` holding everything needed to continue
exactly as if never interrupted:

- ``trainable.safetensors``  the parameters that train (all weights, or only adapters)
- ``buffers.safetensors``    the model's persistent buffers (BatchNorm running statistics)
- ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``  their state_dicts (tensors + numbers)
- ``rng.pt``                  torch / CUDA / Python / NumPy generator states (``rng-R.pt``,
                              one per rank, when distributed)
- ``trainer_state.json``      step, examples consumed (the data position), tokens seen
- ``config.yaml``, ``data.json``  the run's configuration and data files (sizes, SHA-256)
                              these weights were trained with
- ``manifest.json``           the kind, the step, every file's size and SHA-256 (manifest.py)

Everything loads with safetensors or ``torch.load(weights_only=True)``: no pickled code.
Data parallel (distributed.strategy=ddp) writes this same single-process checkpoint from
rank 0 (every rank holds the same weights and state), so it resumes on any number of
processes. A model sharded with FSDP2 writes a sharded checkpoint instead of
``trainable.safetensors``, ``buffers.safetensors`` and ``optimizer.pt``
(memfit/checkpoint/sharded.py); the manifest's kind says which one a folder is. A
folder is loaded only once it matches its manifest, and only the files the manifest lists
are read.
Folders are written under a temporary name and renamed, so a kill mid-save leaves the
previous checkpoint intact; ``checkpoints/index.json`` records which folders this run
saved, the only ones pruning removes (index.py).
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from memfit import distributed
from memfit._utils.atomic import staged_folder
from memfit._utils.errors import CheckpointError, ConfigError
from memfit._utils.weights_only import load_weights_only
from memfit.checkpoint import index
from memfit.checkpoint import sharded as sharded_checkpoint
from memfit.checkpoint.folders import checkpoints_root
from memfit.checkpoint.manifest import CheckpointKind, Manifest, verify_checkpoint, write_manifest
from memfit.distributed.fsdp import is_sharded

CONFIG_FILE = "config.yaml"
DATA_FILE = "data.json"  # the data files' sizes and SHA-256 (memfit.data.fingerprint)
BASE_FILE = "base.json"  # the base model's files' sizes and SHA-256 (models.fingerprint)
RUN_RECORDS = (CONFIG_FILE, DATA_FILE, BASE_FILE)


@dataclass
class TrainerState:
    step: int = 0             # optimizer steps completed
    consumed: int = 0         # training examples drawn from the batch stream
    tokens: int = 0           # loss tokens (or examples) trained on
    elapsed_seconds: float = 0.0
    input_tokens: int = 0     # tokens fed to the model, prompts too, padding not


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: parameter.detach().contiguous()
            for name, parameter in model.named_parameters() if parameter.requires_grad}


def buffer_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The buffers ``model.state_dict()`` holds (non-persistent ones are rebuilt)."""
    saved = model.state_dict().keys()
    return {name: buffer.detach().contiguous()
            for name, buffer in model.named_buffers() if name in saved}


def _rng_state() -> dict:
    numpy_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        # NumPy's state holds an ndarray, which weights_only loading refuses; store a tensor.
        "numpy": (numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)),
                  *numpy_state[2:]),
    }


def _restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


def _save_torch(value, path: Path) -> None:
    """``torch.save`` through a Python file, so that a full disk surfaces as the OSError
    (ENOSPC) behind torch's RuntimeError instead of a bare "unexpected pos"."""
    with path.open("wb") as handle:
        torch.save(value, handle)


def save_checkpoint(run_dir: Path, state: TrainerState, model: nn.Module, optimizer, scheduler,
                    scaler, keep: int) -> Path:
    root = checkpoints_root(run_dir)  # never a link: index.json and pruning live there
    final = root / f"step-{state.step}"
    index.refuse_foreign(final)  # on every rank, so that all of them stop
    sharded = is_sharded(model)
    with (sharded_checkpoint.shared_staged_folder(final) if distributed.is_distributed()
          else staged_folder(final)) as folder:
        if sharded:  # collective: every rank writes its shards
            sharded_checkpoint.save(folder, model, optimizer)
        elif distributed.is_main():  # data parallel: every rank holds the same state
            save_file(trainable_state(model), folder / "trainable.safetensors")
            save_file(buffer_state(model), folder / "buffers.safetensors")
            _save_torch(optimizer.state_dict(), folder / "optimizer.pt")
        rng_file = f"rng-{distributed.rank()}.pt" if distributed.is_distributed() else "rng.pt"
        _save_torch(_rng_state(), folder / rng_file)
        if distributed.is_main():
            _save_torch(scheduler.state_dict(), folder / "scheduler.pt")
            if scaler is not None:
                _save_torch(scaler.state_dict(), folder / "scaler.pt")
            (folder / "trainer_state.json").write_text(json.dumps(asdict(state), indent=2))
            for name in RUN_RECORDS:  # what these weights were trained with, and on
                if (run_dir / name).is_file():
                    shutil.copyfile(run_dir / name, folder / name)
        distributed.barrier()  # every rank's files are complete before they are hashed
        if distributed.is_main():
            kind = CheckpointKind.SHARDED if sharded else CheckpointKind.SINGLE_PROCESS
            write_manifest(folder, kind, state.step)
            index.claim(final)
    if distributed.is_main():
        index.prune(root, keep)
    return final


def _listed(folder: Path, manifest: Manifest, name: str) -> Path:
    """``folder/name``, which verification has checked; CheckpointError when the manifest
    does not list it."""
    if name not in manifest.files:
        raise CheckpointError(f"{folder} has no {name} (its manifest lists "
                              f"{', '.join(sorted(manifest.files))})")
    return folder / name


def _torch_file(folder: Path, manifest: Manifest, name: str):
    path = _listed(folder, manifest, name)
    return load_weights_only(str(path), str(path))


def _safetensors_file(folder: Path, manifest: Manifest, name: str) -> dict[str, torch.Tensor]:
    path = _listed(folder, manifest, name)
    try:
        return load_file(path)
    except SafetensorError as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from None


def _rng_file(manifest: Manifest) -> str:
    """This rank's generator states; a rank the checkpoint did not have (resumed on more
    processes) takes rank 0's."""
    for name in (f"rng-{distributed.rank()}.pt", "rng.pt"):
        if name in manifest.files:
            return name
    return "rng-0.pt"


def _copy_into(folder: Path, name: str, saved: dict[str, torch.Tensor],
               targets: dict[str, torch.Tensor]) -> None:
    unknown = sorted(set(saved) - set(targets))
    if unknown:
        raise CheckpointError(f"{folder / name} holds {unknown[0]!r}, which this model does "
                              "not have (was it saved from another model config?)")
    with torch.no_grad():
        for key, tensor in saved.items():
            targets[key].copy_(tensor)


def _trainer_state(folder: Path, manifest: Manifest) -> TrainerState:
    path = _listed(folder, manifest, "trainer_state.json")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        names = {field.name for field in fields(TrainerState)}
        if not isinstance(raw, dict) or not set(raw) <= names:
            raise ValueError(f"expected the keys {', '.join(sorted(names))}")
        return TrainerState(**raw)
    except (UnicodeDecodeError, ValueError) as error:
        raise CheckpointError(f"{path}: not a trainer state ({error})") from None


def _load_optimizer(folder: Path, optimizer, saved: dict) -> None:
    """The optimizer's state, or a one-line error when it is not this optimizer's (a layout
    an earlier memfit wrote, say)."""
    try:
        optimizer.load_state_dict(saved)
    except (KeyError, ValueError) as error:
        raise CheckpointError(f"{folder / 'optimizer.pt'}: its state does not fit this run's "
                              f"optimizer ({error}); start a new run") from None


def load_checkpoint(folder: Path, model: nn.Module, optimizer, scheduler, scaler) -> TrainerState:
    """Verify ``folder`` against its manifest (DamagedCheckpoint otherwise), then restore
    everything from it; collective for a sharded checkpoint when distributed."""
    manifest = verify_checkpoint(folder)
    if manifest.kind is CheckpointKind.SHARDED:
        sharded_checkpoint.load(folder, manifest.files, model, optimizer)
    elif is_sharded(model):
        raise ConfigError(f"{folder} was written without distributed.strategy=fsdp; resume "
                          "it with distributed.strategy=none or ddp")
    else:
        _copy_into(folder, "trainable.safetensors",
                   _safetensors_file(folder, manifest, "trainable.safetensors"),
                   dict(model.named_parameters()))
        _copy_into(folder, "buffers.safetensors",
                   _safetensors_file(folder, manifest, "buffers.safetensors"),
                   dict(model.named_buffers()))
        _load_optimizer(folder, optimizer, _torch_file(folder, manifest, "optimizer.pt"))
    scheduler.load_state_dict(_torch_file(folder, manifest, "scheduler.pt"))
    if scaler is not None:
        scaler.load_state_dict(_torch_file(folder, manifest, "scaler.pt"))
    _restore_rng(_torch_file(folder, manifest, _rng_file(manifest)))
    return _trainer_state(folder, manifest)
