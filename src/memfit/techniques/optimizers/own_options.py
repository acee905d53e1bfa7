"""An optimizer's own keys: options that only it reads (sgd's ``momentum``), declared by its
spec as a frozen dataclass of ``doc()`` fields (``OptimizerSpec.own``: defaults, limits,
help) and written as ``optimizer.<key>`` beside the shared keys. The config keeps them as
given (``OptimizerConfig.own``); ``check_own_keys`` checks them at load (a key no optimizer
declares is unknown; the named optimizer's values are converted and range-checked) and
``read_own`` hands the spec its block, typed, with its defaults where a key is not set.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from memfit._utils.errors import ConfigError
from memfit.config.fields import is_own_keys
from memfit.config.load import convert_value, unknown_key_message
from memfit.config.reference import KeyDoc, key_docs
from memfit.config.schema import OptimizerConfig
from memfit.techniques.optimizers.spec import OptimizerSpec

Block = TypeVar("Block")


def own_key_names(spec: OptimizerSpec) -> tuple[str, ...]:
    return tuple(entry.name for entry in dataclasses.fields(spec.own)) if spec.own else ()


def read_own(block: type[Block], optimizer: OptimizerConfig) -> Block:
    """``block`` with the values optimizer.* sets for its keys, converted to their types and
    checked against their limits; its defaults elsewhere."""
    hints = typing.get_type_hints(block)
    values: dict[str, Any] = {}
    for entry in dataclasses.fields(block):
        if entry.name not in optimizer.own:
            continue
        key = f"optimizer.{entry.name}"
        value = convert_value(hints[entry.name], optimizer.own[entry.name], key)
        if "limits" in entry.metadata:
            low, high = entry.metadata["limits"]
            if not low <= value <= high:
                raise ConfigError(f"{key}={value} is outside {low} to {high} (a key of "
                                  f"optimizer.name={optimizer.name})")
        values[entry.name] = value
    return block(**values)


def check_own_keys(optimizer: OptimizerConfig, chosen: OptimizerSpec,
                   specs: Iterable[OptimizerSpec]) -> None:
    """Every optimizer.* key beyond the schema's is some optimizer's own (else a ConfigError
    naming the valid keys), and the named optimizer's are valid values. Another optimizer's
    keys are ignored-key warnings (techniques/ignored_rules.py)."""
    declared = sorted({key for spec in specs for key in own_key_names(spec)})
    for key in optimizer.own:
        if key not in declared:
            shared = [entry.name for entry in dataclasses.fields(OptimizerConfig)
                      if not is_own_keys(entry)]
            raise ConfigError(unknown_key_message(f"optimizer.{key}", key,
                                                  [*shared, *declared]))
    if chosen.own is not None:
        read_own(chosen.own, optimizer)


def own_key_docs(specs: Iterable[OptimizerSpec]) -> Iterator[KeyDoc]:
    """docs/config.md's and --help's entries of every optimizer's own keys."""
    for spec in specs:
        if spec.own is not None:
            yield from key_docs(spec.own, "optimizer.", owner=f"optimizer.name={spec.name}: ")
