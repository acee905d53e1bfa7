"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP).

A sharded ``checkpoints/step-N/`` folder holds, beside the files every checkpoint has
(``scheduler.pt``, ``trainer_state.json``, ...):

- ``.metadata`` + ``__R_0.distcp``  the trainable parameters and the optimizer state,
  each rank writing its own shards, keyed by parameter name (``model.<name>``,
  ``optimizer.state.<name>.exp_avg``, ...). DCP reshards on load, so a checkpoint written
  by N processes resumes on M — on one process too, even without a process group.
- ``rng-R.pt``                     each rank's generator states.

Frozen weights (and quantized bases) are not saved: they are rebuilt from the config.
Buffers (BatchNorm statistics) are not saved either: only single-process checkpoints
carry them. Reading goes through ``dcp_reader`` (nothing in the folder is unpickled as
code) and only after the manifest has been verified.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from pathlib import Path

import torch
from torch import nn

from memfit._utils.atomic import staged_folder
from memfit.checkpoint.manifest import CheckpointKind, read_manifest, verify_checkpoint
from memfit.distributed.fsdp import is_sharded
from memfit.distributed.process_group import barrier, broadcast_from_main, is_main

# torch.distributed.checkpoint is imported by the functions that use it (~0.2 s a process
# otherwise): every run saves through this module, and only a sharded model's run reads
# or writes DCP.


def _options():  # noqa: ANN202 -- a StateDictOptions, imported with DCP
    """Frozen parameters are dropped here; buffers by _trainable. strict=False: loading
    sets only what was saved."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=False)


def is_sharded_checkpoint(folder: Path) -> bool:
    """What the checkpoint's manifest says (DamagedCheckpoint when it has none)."""
    return read_manifest(folder).kind is CheckpointKind.SHARDED


@contextlib.contextmanager
def shared_staged_folder(final: Path) -> Iterator[Path]:
    """``staged_folder`` across ranks: rank 0 creates the staging folder, every rank
    writes into it, and rank 0 renames it to ``final`` once all have finished."""
    if is_main():
        with staged_folder(final) as folder:
            broadcast_from_main(folder)
            yield folder
            barrier()
    else:
        folder = broadcast_from_main(None)
        yield folder
        barrier()


def _trainable(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    names = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    return {name: tensor for name, tensor in state.items() if name in names}


def save(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Collective: every rank writes its shards of the trainable weights and state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer, options=_options())
    dcp.save({"model": _trainable(model, model_state), "optimizer": optimizer_state},
             checkpoint_id=folder)


def load(folder: Path, files: Collection[str], model: nn.Module,
         optimizer: torch.optim.Optimizer) -> None:
    """Collective when distributed; reshards to this run's processes (or to a plain,
    unsharded model). ``files``: the names of the folder's verified manifest."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from memfit.checkpoint import dcp_reader

    options = _options()
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    state = {"model": _trainable(model, model_state), "optimizer": optimizer_state}
    dcp_reader.load(state, folder, files)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"], options=options)


def load_trainable(folder: Path, model: nn.Module) -> None:
    """The trainable weights of a sharded checkpoint into a plain model, in place (what
    ``memfit merge`` consolidates; needs no process group). Verifies the folder first."""
    from memfit.checkpoint import dcp_reader

    files = verify_checkpoint(folder).files
    dcp_reader.load({"model": _trainable(model, model.state_dict())}, folder, files)


def gathered_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """Collective: the whole state dict, in host memory on rank 0 (empty elsewhere), for
    exporting a sharded model; None for a model that is not sharded."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
