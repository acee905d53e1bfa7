"""The largest value memfit accepts for every size and count: one table.

Why bounds at all: a value no machine could hold (``train.micro_batch_size=10**23``,
``memfit plan --devices 100000``, 10**12 classes, a YAML alias bomb) would otherwise hang
in a loop, exhaust memory, or overflow inside torch/numpy with a traceback, instead of
failing at once in one line. Every bound is far beyond any real run, so it never limits
real use; the error message names the key and the bound.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

from memfit._utils.errors import ConfigError

# --- YAML: config files, override values, a run folder's config.yaml ----------------------
MAX_CONFIG_BYTES = 2**20  # 1 MiB: memfit's own configs are under 2 KiB; PyYAML reads ~3 s/MiB
MAX_YAML_DEPTH = 32  # nesting of mappings/lists; the schema itself nests 3 deep
MAX_YAML_NODES = 200_000  # values after aliases are expanded (room for MAX_CLASSES labels)

# --- counts ---------------------------------------------------------------------------------
MAX_CLASSES = 100_000  # ImageNet-21k has 21,841; a head this wide is already huge
MAX_DEVICES = 1024  # processes of one run (distributed.nproc, plan --devices)
MAX_BYTES = 2**60  # 1 EiB: memory.budget and plan --budget
MAX_EPOCHS = 10**6
# Per render of a chat template: total iterations of every range() it calls (see
# memfit.data.chat); Jinja's own sandbox allows 100,000 per range but any number of ranges.
MAX_TEMPLATE_RANGE = 100_000

MAX_STEPS = 10**9  # optimizer steps: ~30 years at one step a second
MAX_BATCH = 2**20  # examples per micro-batch, or micro-batches per step
MAX_TOKENS = 2**24  # 16,777,216 tokens: beyond any model's context today
MAX_RANK = 2**16  # beyond any weight's width today
# numpy's np.random.seed takes 0..2**32-1, the narrowest of random, numpy and torch
# (torch.manual_seed: up to 2**64-1), all three seeded with it.
MAX_SEED = 2**32 - 1
# Each whole-number key's (lowest, highest) lives beside it in schema.py: doc(limits=...).


@functools.cache
def int_limits(config_class: type) -> dict[str, tuple[int, int]]:
    """``{dotted key: (lowest, highest)}`` of every field of ``config_class`` (and of the
    sections inside it) whose schema entry carries ``limits``."""
    hints = typing.get_type_hints(config_class)
    found: dict[str, tuple[int, int]] = {}
    for entry in dataclasses.fields(config_class):
        if dataclasses.is_dataclass(hints[entry.name]):
            found.update({f"{entry.name}.{key}": bounds
                          for key, bounds in int_limits(hints[entry.name]).items()})
        elif "limits" in entry.metadata:
            found[entry.name] = entry.metadata["limits"]
    return found


def lookup(config: Any, key: str) -> Any:
    """``config``'s value of a dotted key (``"train.seed"``)."""
    for part in key.split("."):
        # A part's own key (config/fields.py: own_keys) not given: None, the default of
        # every such key that row_reset puts back.
        config = getattr(config, part) if hasattr(config, part) else config.own.get(part)
    return config


def check_int_limits(config: Any) -> None:
    """Every whole-number key inside its bounds, else a ConfigError naming it and the bound
    (unset optional keys, None, and words such as log.memory_every=auto are skipped)."""
    for key, (low, high) in int_limits(type(config)).items():
        value = lookup(config, key)
        if not isinstance(value, str):
            check_count(key, value, low, high)


def check_count(what: str, value: int | None, low: int, high: int) -> None:
    """One whole number inside [low, high]; ``what`` names it in the message."""
    if value is None:
        return
    if value < low:
        words = "0 or more" if low == 0 else f"at least {low}"
        raise ConfigError(f"{what} must be {words}, got {value}")
    if value > high:
        raise ConfigError(f"{what}={value} is beyond memfit's limit of {high:,}")


def check_bytes(what: str, value: int, given: Any) -> None:
    """A byte count above 0 and at most MAX_BYTES (``given``: as the user wrote it)."""
    if value <= 0:
        raise ConfigError(f"{what} must be above 0 bytes, got {given}")
    if value > MAX_BYTES:
        raise ConfigError(f"{what}={given} is beyond memfit's limit of {MAX_BYTES:,} bytes "
                          "(1 EiB)")


# Keys naming files and folders (or 'file.py:name' / 'module:name' references).
PATH_LIKE_KEYS = ("model.path", "model.factory", "model.loss", "model.export_module",
                  "data.path", "data.eval_path", "train.output_dir")


def check_control_characters(config: Any) -> None:
    """No control character (a line break, a tab, ...) in a path key: YAML would have folded
    a line break into a space on the way through config.yaml, and a path holding one breaks
    every one-line message that names it; no real file name needs one."""
    for key in PATH_LIKE_KEYS:
        value = lookup(config, key)
        if isinstance(value, str) and any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ConfigError(f"{key}={value!r:.200} holds a control character (a line break, "
                              "a tab, ...); name a path without one")
