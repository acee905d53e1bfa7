"""``torch.load`` that runs no code from the file, and fails in one line naming it."""

from __future__ import annotations

import pickle
import warnings
from typing import IO, Any

import torch

from memfit._utils.errors import CheckpointError, first_line


def load_weights_only(source: str | IO[bytes], name: str) -> Any:
    """Tensors and plain values (numbers, strings, lists, dicts, tuples) from ``source``;
    CheckpointError naming ``name`` for anything else or for bytes that are not a torch
    file."""
    try:
        with warnings.catch_warnings():
            # torch warns about the pickle protocol of files DCP writes: noise, not damage.
            warnings.simplefilter("ignore")
            return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{name}: refused, it holds something other than tensors and "
                              "plain values (memfit never unpickles code)") from None
    except (RuntimeError, EOFError, ValueError) as error:
        raise CheckpointError(f"{name}: not a readable torch file ({first_line(error)})") \
            from None
