"""Reading a sharded checkpoint through ``torch.distributed.checkpoint`` without running
anything found in it.

DCP's own ``FileSystemReader`` unpickles ``.metadata`` with ``pickle`` (a planted file
runs code) and its ``DefaultLoadPlanner`` reads every non-tensor item (the optimizer's
``param_groups`` numbers) with ``torch.load(weights_only=False)``. Here:

- ``.metadata`` is unpickled by an ``Unpickler`` that resolves only the classes DCP's
  metadata is made of (recorded from real FSDP2 checkpoints of this torch), and every
  file it points the reads at must be one the checkpoint's manifest lists;
- non-tensor items load with ``weights_only=True``; tensor items already do in DCP.
"""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from memfit._utils.errors import CheckpointError, MemfitError
from memfit._utils.weights_only import load_weights_only

METADATA_FILE = ".metadata"

_DCP_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "StorageMeta", "MetadataIndex", "ChunkStorageMetadata",
        "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties",
        "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # looks a torch.layout up by name
    "torch": {"Size"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _DCP_METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")


def read_metadata(folder: Path, files: Collection[str]) -> Metadata:
    """``folder/.metadata``, refusing any class outside DCP's metadata and any read of a
    file not in ``files`` (the manifest's names)."""
    path = folder / METADATA_FILE
    if METADATA_FILE not in files:
        raise CheckpointError(f"{folder} is sharded but its manifest lists no {METADATA_FILE}")
    try:
        with path.open("rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except pickle.UnpicklingError as error:
        raise CheckpointError(f"{path}: refused ({error}; memfit never unpickles code)") \
            from None
    except (EOFError, ValueError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{path}: not DCP metadata ({error})") from None
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(metadata, Metadata) or not isinstance(storage, dict):
        raise CheckpointError(f"{path}: not DCP metadata")
    for info in storage.values():
        if not isinstance(info, _StorageInfo) or info.relative_path not in files:
            where = getattr(info, "relative_path", info)
            raise CheckpointError(f"{path}: refused, it points at {where!r}, which is not a "
                                  "file of the checkpoint's manifest")
    return metadata


class _AllowListedReader(FileSystemReader):
    """DCP's file reader with the metadata read as above."""

    def __init__(self, folder: Path, metadata: Metadata):
        super().__init__(folder)
        self._metadata = metadata

    # No **kwargs: DCP would otherwise retry a failed read with rank-local metadata files.
    def read_metadata(self) -> Metadata:  # type: ignore[override]
        if self._metadata.storage_meta is None:
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata


class _WeightsOnlyPlanner(DefaultLoadPlanner):
    """DCP's planner, with non-tensor items read weights-only."""

    def __init__(self, folder: Path):
        super().__init__()
        self._folder = folder

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = load_weights_only(value, f"{self._folder} item {read_item.dest_index.fqn}")
        # The parent places the item in the (possibly nested) state dict; it reads with
        # weights_only=False, so it gets only bytes written here from the checked value.
        checked = io.BytesIO()
        torch.save(loaded, checked)
        checked.seek(0)
        super().load_bytes(read_item, checked)


def load(state: dict[str, Any], folder: Path, files: Collection[str]) -> None:
    """``dcp.load(state, folder)`` in place, reading only what the above allows.
    Collective when a process group exists."""
    metadata = read_metadata(folder, files)
    try:
        with warnings.catch_warnings():
            # Loading without a process group (merge, tests) is intended, not news.
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.load(state, storage_reader=_AllowListedReader(folder, metadata),
                     planner=_WeightsOnlyPlanner(folder))
    except CheckpointException as error:
        # DCP gathers every rank's failure into one exception: surface memfit's own.
        for cause, _ in error.failures.values():
            if isinstance(cause, MemfitError):
                raise cause from None
        raise
