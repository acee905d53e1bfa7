"""The "tensors" format: named arrays whose first dimension indexes the examples.

A ``.npz`` file (named numpy arrays) or a ``.pt`` file holding a ``dict[str, Tensor]``
(read with ``torch.load(weights_only=True)``, so no code in the file runs). Every array has
the same first dimension N; example i is ``{name: array[i]}``. A folder of such files is
joined along dimension 0, and every file must hold the same names.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from memfit._utils.errors import DataError


class TensorDictDataset(torch.utils.data.Dataset):
    """Example i is ``{name: tensors[name][indices[i]]}``; the arrays are shared, not copied."""

    def __init__(self, tensors: dict[str, torch.Tensor], indices: torch.Tensor) -> None:
        self.tensors = tensors
        self.indices = indices  # (len,) int64 rows of the arrays that belong to this split

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = int(self.indices[i])
        return {name: tensor[row] for name, tensor in self.tensors.items()}


def read_tensors(files: Sequence[str]) -> dict[str, torch.Tensor]:
    """Load and join the named arrays of each file; each value has shape (N, ...)."""
    parts = [_read_one(file) for file in files]
    names = sorted(parts[0])
    for file, part in zip(files[1:], parts[1:], strict=True):
        if sorted(part) != names:
            raise DataError(
                f"data file {file} holds arrays {', '.join(sorted(part))} but {files[0]} holds "
                f"{', '.join(names)}; every file in the folder needs the same names"
            )
    joined = {name: torch.cat([part[name] for part in parts]) for name in names}
    if len(next(iter(joined.values()))) == 0:
        raise DataError(f"data file {files[0]} has no examples (first dimension is 0)")
    return joined


def _read_one(file: str) -> dict[str, torch.Tensor]:
    try:
        if file.lower().endswith(".npz"):
            with np.load(file, allow_pickle=False) as archive:
                loaded = {name: torch.from_numpy(archive[name]) for name in archive.files}
        else:
            loaded = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # an unreadable file is the user's to fix
        raise DataError(f"cannot read data file {file}: {error}".splitlines()[0]) from error
    if not isinstance(loaded, dict) or not loaded:
        raise DataError(
            f"data file {file} must hold a non-empty dict of named tensors, "
            f"got {type(loaded).__name__}"
        )
    bad = [str(name) for name, value in loaded.items() if not isinstance(value, torch.Tensor)]
    if bad:
        raise DataError(
            f"data file {file}: {', '.join(bad)} are not tensors; every value must be a tensor"
        )
    sizes = {name: (tuple(value.shape[:1]) or None) for name, value in loaded.items()}
    if len(set(sizes.values())) != 1 or None in sizes.values():
        shapes = ", ".join(f"{name} {tuple(value.shape)}" for name, value in loaded.items())
        raise DataError(
            f"data file {file}: every array needs the same first dimension (the example count); "
            f"got {shapes}"
        )
    return loaded
