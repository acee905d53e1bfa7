"""A checkpoint is a folder ``checkpoints/step-N/`` holding everything needed to continue
exactly as if never interrupted:

- ``trainable.safetensors``  the parameters that train (all weights, or only adapters)
- ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``  their state_dicts (tensors + numbers)
- ``rng.pt``                  torch / CUDA / Python / NumPy generator states
- ``trainer_state.json``      step, examples consumed (the data position), tokens seen

Everything loads with safetensors or ``torch.load(weights_only=True)``: no pickled code.
A model sharded with FSDP2 writes a sharded checkpoint instead of ``trainable.safetensors``
and ``optimizer.pt`` (memfit/distributed/checkpoint.py); loading recognises either kind.
Folders are written under a temporary name and renamed, so a kill mid-save leaves the
previous checkpoint intact.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from memfit import distributed
from memfit._utils.atomic import staged_folder
from memfit._utils.errors import ConfigError
from memfit.distributed import checkpoint as sharded_checkpoint
from memfit.distributed.fsdp import is_sharded

STEP_FOLDER = re.compile(r"^step-(\d+)$")


@dataclass
class TrainerState:
    step: int = 0             # optimizer steps completed
    consumed: int = 0         # training examples drawn from the batch stream
    tokens: int = 0           # loss tokens (or examples) trained on
    elapsed_seconds: float = 0.0


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: parameter.detach().contiguous()
            for name, parameter in model.named_parameters() if parameter.requires_grad}


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


def save_checkpoint(run_dir: Path, state: TrainerState, model: nn.Module, optimizer, scheduler,
                    scaler, keep: int) -> Path:
    root = run_dir / "checkpoints"
    final = root / f"step-{state.step}"
    sharded = is_sharded(model)
    with (sharded_checkpoint.shared_staged_folder(final) if sharded
          else staged_folder(final)) as folder:
        if sharded:  # collective: every rank writes its shards
            sharded_checkpoint.save(folder, model, optimizer)
            torch.save(_rng_state(), folder / f"rng-{distributed.rank()}.pt")
        else:
            save_file(trainable_state(model), folder / "trainable.safetensors")
            torch.save(optimizer.state_dict(), folder / "optimizer.pt")
            torch.save(_rng_state(), folder / "rng.pt")
        if distributed.is_main():
            torch.save(scheduler.state_dict(), folder / "scheduler.pt")
            if scaler is not None:
                torch.save(scaler.state_dict(), folder / "scaler.pt")
            (folder / "trainer_state.json").write_text(json.dumps(asdict(state), indent=2))
    if distributed.is_main():
        for old in _checkpoints(root)[:-keep]:
            shutil.rmtree(old)
    return final


def _checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first (staging folders start with a dot)."""
    if not root.is_dir():
        return []
    found = [(int(match.group(1)), path) for path in root.iterdir()
             if (match := STEP_FOLDER.match(path.name))]
    return [path for _, path in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = _checkpoints(run_dir / "checkpoints")
    return found[-1] if found else None


def _rng_file(folder: Path) -> Path:
    """This rank's generator states; a rank the checkpoint did not have (resumed on more
    processes) takes rank 0's."""
    for name in (f"rng-{distributed.rank()}.pt", "rng.pt"):
        if (folder / name).is_file():
            return folder / name
    return folder / "rng-0.pt"


def load_checkpoint(folder: Path, model: nn.Module, optimizer, scheduler, scaler) -> TrainerState:
    if sharded_checkpoint.is_sharded_checkpoint(folder):
        sharded_checkpoint.load(folder, model, optimizer)
    elif is_sharded(model):
        raise ConfigError(f"{folder} was written without distributed.strategy=fsdp; resume "
                          "it with distributed.strategy=none")
    else:
        weights = load_file(folder / "trainable.safetensors")
        parameters = dict(model.named_parameters())
        with torch.no_grad():
            for name, tensor in weights.items():
                parameters[name].copy_(tensor)
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
    if scaler is not None:
        scaler.load_state_dict(torch.load(folder / "scaler.pt", weights_only=True))
    _restore_rng(torch.load(_rng_file(folder), weights_only=True))
    return TrainerState(**json.loads((folder / "trainer_state.json").read_text()))
