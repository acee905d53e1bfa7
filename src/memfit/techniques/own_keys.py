"""The keys a part declares for itself (an optimizer's ``optimizer.momentum``, a memory
technique's ``memory.freeze_blocks``): a frozen dataclass of ``doc()`` fields in its spec
(``OptimizerSpec.own``, ``TechniqueSpec.own``: default, limits, help), written as
``section.key`` beside the section's shared keys. The config keeps them as given (the
section's ``own`` field, config/fields.py); here they are checked at load (a key no part
declares is unknown; the values are converted and range-checked) and read, typed and with
their defaults where a key is not set, by the part that declares them.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

from memfit._utils.errors import ConfigError
from memfit.config.fields import is_own_keys
from memfit.config.load import convert_value, unknown_key_message
from memfit.config.reference import KeyDoc, key_docs
from memfit.config.schema import MemoryConfig

Block = TypeVar("Block")


def names(block: type | None) -> tuple[str, ...]:
    """The keys ``block`` declares (none for None)."""
    return tuple(entry.name for entry in dataclasses.fields(block)) if block else ()


def defaults(block: type | None) -> dict[str, Any]:
    """Each key ``block`` declares, with its default (none for None)."""
    return {entry.name: entry.default for entry in dataclasses.fields(block)} if block else {}


def read_own(block: type[Block], section: str, given: Mapping[str, Any], owner: str) -> Block:
    """``block`` with the values ``given`` (a section's own keys) sets for its keys,
    converted to their types and checked against their limits; its defaults elsewhere.
    ``owner`` names the part in messages (``optimizer.name=sgd``)."""
    hints = typing.get_type_hints(block)
    values: dict[str, Any] = {}
    for entry in dataclasses.fields(block):
        if entry.name not in given:
            continue
        key = f"{section}.{entry.name}"
        value = convert_value(hints[entry.name], given[entry.name], key)
        if "limits" in entry.metadata and value is not None:
            low, high = entry.metadata["limits"]
            if not low <= value <= high:
                raise ConfigError(f"{key}={value} is outside {low} to {high} (a key of "
                                  f"{owner})")
        values[entry.name] = value
    return block(**values)


def technique_options(block: type[Block], memory: MemoryConfig, owner: str) -> Block:
    """A technique spec's own block (``TechniqueSpec.own``) as memory.* sets it; ``owner``:
    the technique's name, for messages."""
    return read_own(block, "memory", memory.own, owner)


def check_declared(section: str, section_class: type, given: Iterable[str],
                   blocks: Iterable[type | None]) -> None:
    """Every key of ``given`` is declared by one of ``blocks``; else a ConfigError naming
    the section's valid keys (its shared ones and every declared one)."""
    declared = sorted({key for block in blocks for key in names(block)})
    for key in given:
        if key not in declared:
            shared = [entry.name for entry in dataclasses.fields(section_class)
                      if not is_own_keys(entry)]
            raise ConfigError(unknown_key_message(f"{section}.{key}", key,
                                                  [*shared, *declared]))


def own_key_docs(section: str, blocks: Iterable[tuple[str, type | None]]) -> Iterator[KeyDoc]:
    """docs/config.md's and --help's entries of the (owner, block) pairs' keys."""
    for owner, block in blocks:
        if block is not None:
            yield from key_docs(block, f"{section}.", owner=f"{owner}: ")
