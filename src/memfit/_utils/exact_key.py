"""``exact_key``: a value as a cache key in which values that compare equal but differ in
type stay apart. Python has ``1 == 1.0 == True`` with one hash, so a frozen dataclass holding
``memory.checkpoint_blocks=1`` (the first block) and one holding ``1.0`` (every block)
would share a dict entry."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from typing import Any


def exact_key(value: Any) -> Hashable:
    """Dataclasses field by field, mappings by item, sequences and sets by element, each
    leaf with its type."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value), tuple(exact_key(getattr(value, field.name))
                                  for field in dataclasses.fields(value))
    if isinstance(value, Mapping):
        return type(value), frozenset((exact_key(key), exact_key(item))
                                      for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return type(value), tuple(exact_key(item) for item in value)
    if isinstance(value, (set, frozenset)):
        return type(value), frozenset(exact_key(item) for item in value)
    return type(value), value
