"""The "tensors" format: named arrays whose first dimension indexes the examples.

A ``.npz`` file (named numpy arrays) or a ``.pt`` file holding a ``dict[str, Tensor]``
(read with ``torch.load(weights_only=True)``, so no code in the file runs). Every array has
the same first dimension N; example i is ``{name: array[i]}``. A folder of such files is
joined along dimension 0, and every file must hold the same names and shapes.

Token data: ``input_ids`` is (N, L) and ``attention_mask``, when present, has the same
shape (one mask value per token). Any other array (``labels`` as one class per example,
(N,), or one label per token, (N, L)) is taken as it is; collate stacks it.
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
    for file, part in zip(files[1:], parts[1:], strict=True):
        check_same_shapes(parts[0], part, f"data file {files[0]}", f"data file {file}")
    joined = {name: torch.cat([part[name] for part in parts]) for name in sorted(parts[0])}
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
    _check_token_shapes(loaded, file)
    return loaded


def _check_token_shapes(tensors: dict[str, torch.Tensor], file: str) -> None:
    ids = tensors.get("input_ids")
    if ids is None:
        return
    if ids.ndim != 2:
        raise DataError(f"data file {file}: input_ids has shape {tuple(ids.shape)}; token data "
                        "needs (examples, tokens)")
    mask = tensors.get("attention_mask")
    if mask is not None and mask.shape != ids.shape:
        raise DataError(f"data file {file}: attention_mask has shape {tuple(mask.shape)} but "
                        f"input_ids {tuple(ids.shape)}; the mask needs one value per token")


def check_same_shapes(first: dict[str, torch.Tensor], other: dict[str, torch.Tensor],
                      first_where: str, other_where: str) -> None:
    """Two sets of named arrays must hold the same names, each of the same shape after the
    first (example) dimension, so their examples batch together."""
    if sorted(first) != sorted(other):
        raise DataError(f"{other_where} holds arrays {', '.join(sorted(other))} but "
                        f"{first_where} holds {', '.join(sorted(first))}; both need the same names")
    for name, tensor in first.items():
        if other[name].shape[1:] != tensor.shape[1:]:
            raise DataError(
                f"{other_where}: {name} has shape {tuple(other[name].shape)} but "
                f"{first_where} has {tuple(tensor.shape)}; every example of {name} needs the "
                "same shape (only the first dimension, the example count, may differ)")
