"""Dotted-key overrides of a ``Config`` (``{"optimizer.name": "adamw8bit"}``, the values a
user writes): applied without validation, compared with a config, read back. The planner's
strategy rows, the OOM ladder and ``memfit plan``'s "apply with:" lines are such overrides.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any

from memfit.config.fields import is_own_keys
from memfit.config.limits import lookup
from memfit.config.load import convert_value
from memfit.config.schema import Config

Overrides = dict[str, Any]


def value_of(config: Config, key: str) -> Any:
    """A dotted key's value in ``config``, as a user writes it (an enum by its value)."""
    value = lookup(config, key)
    return value.value if isinstance(value, enum.Enum) else value


def differing(config: Config, overrides: Overrides) -> Overrides:
    """The overrides that change ``config``: what a user must write to apply a row."""
    return {key: value for key, value in overrides.items() if value_of(config, key) != value}


def with_overrides(config: Config, overrides: Overrides) -> Config:
    """``config`` with dotted-key overrides applied, WITHOUT validation: the planner must
    plan keys whose feature may still be rejected by config.validate."""
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return _replace(config, nested)


def _replace(node: Any, changes: dict[str, Any]) -> Any:
    updates: dict[str, Any] = {}
    hints = typing.get_type_hints(type(node))
    own = next((f.name for f in dataclasses.fields(node) if is_own_keys(f)), None)
    for key, value in changes.items():
        if own is not None and (key not in hints or key == own):  # a part's own key
            given = {**updates.get(own, getattr(node, own)), key: value}
            # null is every such key's default (config.limits.lookup): not given, so a
            # row that resets it equals the config that never set it
            updates[own] = {name: v for name, v in given.items() if v is not None}
        elif isinstance(value, dict) and dataclasses.is_dataclass(hints[key]):
            updates[key] = _replace(getattr(node, key), value)
        else:  # as the YAML loader converts it (e.g. "adamw" is a name, not a class path)
            updates[key] = convert_value(hints[key], value, key)
    return dataclasses.replace(node, **updates)
