"""What ``memfit merge`` checks in a run's ``adapter/`` before it folds it into the base.

A run folder may come from a colleague or a hub, and PEFT loads whatever it is given as
well as it can: keys that match no module are dropped with a warning (the "merged" model
is then exactly the untrained base), nan/inf values are added into the weights, and an
initialisation such as PiSSA or LoftQ, which rewrote the base weights during training,
is merged onto a base that no longer matches. So the adapter is checked against what memfit
itself writes and what PEFT's ``merge_and_unload`` reproduces exactly, and anything else is
refused in one line naming the file, the key or field, and the value:

- before the base is loaded (seconds): the folder and its files lie inside the run folder;
  ``adapter_config.json`` is a JSON object of LoRA settings memfit could have written
  (``lora_settings``); the safetensors files parse, every adapter tensor is floating point,
  every floating tensor is finite, and the LoRA factors (a fused projection's per-part
  ones too) have the config's rank; ``parts.json``, if there, maps module names of
  ``target_modules`` to q/k/v rows in order that do not overlap (``read_parts``)
  (``read_adapter``);
- once the base is built and wrapped, before anything is written: ``target_modules`` names
  modules of the base (``check_targets``), and the adapter's tensors are exactly the ones
  that wrapping calls for, each with its shape and kind of dtype (``check_tensors_fit``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from memfit._utils.errors import ConfigError
from memfit.checkpoint.export import BUFFERS_FILE, PARTS_FILE

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


# PEFT puts a modules_to_save entry into a regular expression as it is, and matches a
# string target_modules against every module name: a crafted pattern could backtrack for
# hours. memfit writes module names, and the anchored alternation of them escaped.
_PLAIN_NAME = re.compile(r"[\w.\-]+")
_ALTERNATION = re.compile(r"\^\(\?:(.+)\)\$", re.DOTALL)


def _is_names(value: Any) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(v, str) and _PLAIN_NAME.fullmatch(v) for v in value))


def exact_names(target_modules: str) -> list[str] | None:
    """The module names in ``target_modules`` when it is what memfit writes, an anchored
    alternation of escaped exact names (``^(?:a\\.b|c)$``); None for any other string."""
    found = _ALTERNATION.fullmatch(target_modules)
    if found is None:
        return None
    parts = found.group(1).split("|")
    names = [re.sub(r"\\(.)", r"\1", part, flags=re.DOTALL) for part in parts]
    escaped = all(name and re.escape(name) == part for name, part in zip(names, parts, strict=True))
    return names if escaped else None


def _anything(_value: Any) -> bool:
    return True


# The fields memfit writes with values of its own (techniques/lora.py, export.py): each
# with what is accepted. Every other LoraConfig field must hold PEFT's default.
_FREE: dict[str, tuple[Callable[[Any], bool], str]] = {
    "peft_type": (lambda v: v == "LORA", '"LORA" (memfit merges LoRA adapters only)'),
    "task_type": (lambda v: v in (None, "SEQ_CLS", "CAUSAL_LM"),
                  'null, "SEQ_CLS" or "CAUSAL_LM"'),
    "r": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
          "a positive integer"),
    "lora_alpha": (_is_number, "a finite number"),
    "lora_dropout": (lambda v: _is_number(v) and 0 <= v <= 1, "a number from 0 to 1"),
    "use_rslora": (lambda v: isinstance(v, bool), "true or false"),
    "use_dora": (lambda v: isinstance(v, bool), "true or false"),
    "inference_mode": (lambda v: isinstance(v, bool), "true or false"),
    "target_modules": (lambda v: (isinstance(v, str) and exact_names(v) is not None)
                       or _is_names(v),
                       "the module names as memfit writes them: ^(?:NAME|...)$ with each "
                       "name escaped, or a list of names"),
    "modules_to_save": (lambda v: v is None or _is_names(v), "null or a list of module names"),
    # Where the adapter came from: PEFT records it, nothing is loaded from it.
    "auto_mapping": (_anything, ""),
    "peft_version": (_anything, ""),
    "base_model_name_or_path": (_anything, ""),
    "revision": (_anything, ""),
}
# Without these PEFT would fill in defaults (r=8, lora_alpha=8) that merge a different
# update than the one trained: a config memfit wrote always has them.
_REQUIRED = ("peft_type", "r", "lora_alpha", "target_modules")
_CHANGES_THE_BASE = ("it rewrites the base weights when the adapter is created, so the "
                     "rebuilt base is not the one the adapter was trained on")
_WHY = dict.fromkeys(("init_lora_weights", "loftq_config", "eva_config", "corda_config",
                      "lora_ga_config"), _CHANGES_THE_BASE)


def _lora_defaults() -> dict[str, Any]:
    """PEFT's default of every field of the installed ``LoraConfig``."""
    from peft import LoraConfig

    defaults = {}
    for field in dataclasses.fields(LoraConfig):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
    return defaults


def _empty(value: Any) -> bool:
    return value is None or value is False or value in ({}, [], "")


def _is_default(value: Any, default: Any) -> bool:
    """``value`` means what ``default`` means (null, false and {} all mean "none")."""
    if value is default or (_empty(value) and _empty(default)):
        return True
    # true is not 1: PEFT tests `init_lora_weights is True`
    return not isinstance(value, bool) and not isinstance(default, bool) and value == default


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def lora_settings(path: Path) -> dict[str, Any]:
    """The ``LoraConfig`` keyword arguments in ``path`` (an adapter_config.json), once each
    field is one memfit writes with a valid value, or PEFT's default (or an unknown field
    left empty, as a newer PEFT writes them)."""
    try:
        raw = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ConfigError(f"{path}: not a readable JSON file ({error})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: holds {type(raw).__name__} {_shown(raw)}, not a JSON object "
                          "of LoRA settings")
    missing = [name for name in _REQUIRED if name not in raw]
    if missing:
        raise ConfigError(f"{path}: no {missing[0]} field; PEFT would use its default and "
                          "merge an update other than the one trained")
    defaults, settings = _lora_defaults(), {}
    for name, value in raw.items():
        if name in _FREE:
            accepts, expected = _FREE[name]
            if not accepts(value):
                raise ConfigError(f"{path}: {name}={_shown(value)}; memfit merge needs "
                                  f"{expected}")
        elif name not in defaults:
            if _empty(value):
                continue  # a setting of another PEFT version, unused
            raise ConfigError(f"{path}: {name}={_shown(value)} is not a LoRA setting the "
                              "installed PEFT knows; memfit merge cannot tell what it changes")
        elif not _is_default(value, defaults[name]):
            why = _WHY.get(name, "memfit never writes it, and merging such an adapter onto "
                                 "the rebuilt base is not checked to reproduce it")
            raise ConfigError(f"{path}: {name}={_shown(value)} cannot be merged faithfully: "
                              f"{why} (memfit writes {_shown(defaults[name])})")
        settings[name] = value
    return settings


def read_tensors(path: Path, floating_only: bool) -> dict[str, Tensor]:
    """Every tensor of the safetensors file ``path``, each floating one finite (and with
    ``floating_only`` every one floating), or a ConfigError naming the file and key."""
    tensors = {}
    try:
        with safe_open(path, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensor = handle.get_tensor(name)
                if floating_only and not tensor.is_floating_point():
                    raise ConfigError(f"{path}: {name!r} holds {tensor.dtype}, not floating "
                                      "point weights")
                if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                    bad = "nan" if torch.isnan(tensor).any() else "inf"
                    raise ConfigError(f"{path}: {name!r} holds {bad} values; merging it would "
                                      "write them into the model's weights")
                tensors[name] = tensor
    except (SafetensorError, OSError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ConfigError(f"{path}: not a readable safetensors file ({reason})") from None
    return tensors


@dataclasses.dataclass(frozen=True)
class Adapter:
    """A run's ``adapter/``, read and checked without the base."""

    settings: dict[str, Any]  # LoraConfig's keyword arguments
    weights: dict[str, Tensor]  # adapter_model.safetensors
    buffers: dict[str, Tensor] | None  # buffers.safetensors, if there
    parts: dict[str, dict[str, tuple[int, int]]]  # parts.json: module -> part -> rows


def read_adapter(run_dir: Path, adapter_dir: Path) -> Adapter:
    """``adapter_dir`` (in ``run_dir``), once its files passed every check that needs no
    base: run these before building the base, which takes minutes for a large model."""
    config_file, weights_file = adapter_dir / CONFIG_FILE, adapter_dir / WEIGHTS_FILE
    buffers_file = adapter_dir / BUFFERS_FILE
    parts_file = adapter_dir / PARTS_FILE
    check_inside(run_dir, (adapter_dir, config_file, weights_file, buffers_file, parts_file))
    settings = lora_settings(config_file)
    weights = read_tensors(weights_file, floating_only=True)
    _check_rank(weights_file, settings["r"], weights)
    buffers = (read_tensors(buffers_file, floating_only=False)
               if buffers_file.is_file() else None)
    parts = read_parts(parts_file, settings["target_modules"]) if parts_file.is_file() else {}
    return Adapter(settings, weights, buffers, parts)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _valid_rows(rows: Any) -> bool:
    if not isinstance(rows, dict) or not rows or list(rows) != [p for p in "qkv" if p in rows]:
        return False
    previous_stop = 0
    for bounds in rows.values():
        if not (isinstance(bounds, list) and len(bounds) == 2 and all(map(_is_count, bounds))):
            return False
        start, stop = bounds
        if not previous_stop <= start < stop:
            return False
        previous_stop = stop
    return True


def read_parts(path: Path, target_modules: str | list[str]
               ) -> dict[str, dict[str, tuple[int, int]]]:
    """``parts.json``: each module (one ``target_modules`` names exactly) -> its parts
    among q, k, v (in that order) -> rows ``[start, stop)``, ascending and disjoint.
    Whether the rows fit the module is checked once the base is built (the factors'
    shapes, ``check_tensors_fit``; the width, ``check_parts_fit``)."""
    try:
        raw = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ConfigError(f"{path}: not a readable JSON file ({error})") from None
    exact = exact_names(target_modules) if isinstance(target_modules, str) else None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: holds {_shown(raw)}, not an object of module -> parts")
    parts = {}
    for name, rows in raw.items():
        if not (name in (exact or []) if isinstance(target_modules, str)
                else _list_names(target_modules, name)):
            raise ConfigError(f"{path}: {name!r} is not among the target_modules of "
                              f"{CONFIG_FILE}")
        if not _valid_rows(rows):
            raise ConfigError(f"{path}: {name}={_shown(rows)}; memfit merge needs parts among "
                              'q, k, v in that order, each [start, stop) ascending and '
                              'disjoint, e.g. {"q": [0, 64], "v": [128, 192]}')
        parts[name] = {part: (r[0], r[1]) for part, r in rows.items()}
    return parts


def check_parts_fit(path: Path, parts: dict[str, dict[str, tuple[int, int]]],
                    widths: dict[str, int | None]) -> None:
    """Each module of ``parts`` (read from ``path``) is a fused projection of the base
    (``widths``: name -> output rows, None for a module that is not one) whose rows hold
    every part."""
    for name, rows in parts.items():
        width = widths.get(name)
        stop = max(end for _, end in rows.values())
        if width is None or stop > width:
            found = "is no fused q,k,v projection" if width is None else f"has {width} rows"
            raise ConfigError(f"{path}: {name} {found} in the base, but its parts reach row "
                              f"{stop} (an adapter of another model?)")


def _check_rank(path: Path, rank: int, weights: dict[str, Tensor]) -> None:
    """The file holds LoRA factors, each of rank ``r``: PEFT allocates the adapter from
    adapter_config.json before it reads a weight, so a forged r of 10**9 would exhaust
    memory before any shape was compared."""
    factors = 0
    for name, tensor in weights.items():
        # PEFT's lora_A.weight, or a fused projection's part: lora_A.<adapter>.q.weight
        factor = re.fullmatch(r".*\.lora_([AB])(?:\.[^.]+\.[qkv])?\.weight", name)
        axis = None if factor is None else 0 if factor.group(1) == "A" else 1
        if axis is None:
            continue
        factors += 1
        if tensor.dim() < 2 or tensor.shape[axis] != rank:
            raise ConfigError(f"{path}: {name!r} has shape {tuple(tensor.shape)}, not rank "
                              f"r={rank} as {CONFIG_FILE} says")
    if not factors:
        raise ConfigError(f"{path}: holds no LoRA weights (no *.lora_A.weight); nothing to "
                          "merge")


def check_inside(run_dir: Path, paths: Iterable[Path]) -> None:
    """Each of ``paths`` (found through ``run_dir``) is really inside the run folder: a
    symlink out of it would merge someone else's file under this run's name."""
    run = run_dir.resolve()
    for path in paths:
        if path.exists() and not path.resolve().is_relative_to(run):
            raise ConfigError(f"memfit merge {run_dir}: {path} is a link to {path.resolve()}, "
                              "outside the run folder; copy the file into the run instead")


def _list_names(entries: list[str], name: str) -> bool:
    """A list ``target_modules`` names module ``name`` as PEFT reads it: an entry equal to
    the name or to its last parts."""
    return any(name == entry or name.endswith(f".{entry}") for entry in entries)


def check_targets(path: Path, target_modules: str | list[str], names: list[str]) -> None:
    """Each module ``target_modules`` (checked by ``lora_settings``, in ``path``) names is
    one of the base's ``names``: PEFT adapts what matches and quietly skips the rest. An
    exact name must be there; a list entry, as in PEFT, may also be a name's last parts."""
    exact = exact_names(target_modules) if isinstance(target_modules, str) else None
    present = set(names)
    for entry in exact or target_modules:
        if not (entry in present if exact else any(_list_names([entry], name) for name in names)):
            raise ConfigError(f"{path}: target_modules names {entry!r}, which is no module "
                              "of the base (an adapter of another model?)")


def check_tensors_fit(path: Path, saved: dict[str, Tensor], expected: dict[str, Tensor],
                      what: str, complete: bool = True,
                      optional: dict[str, Tensor] | None = None) -> None:
    """``saved`` (read from ``path``) holds only names of ``expected`` (or of ``optional``),
    each with its shape and its kind of dtype (floating or the same integer type); with
    ``complete``, all of ``expected``. ``what`` says what the expected names come from."""
    expected_or_optional = {**(optional or {}), **expected}
    unexpected = sorted(set(saved) - set(expected_or_optional))
    if unexpected:
        raise ConfigError(f"{path}: {len(unexpected)} tensor(s) match nothing in {what}, e.g. "
                          f"{unexpected[0]!r} (renamed, or saved for another model?)")
    missing = sorted(set(expected) - set(saved)) if complete else []
    if missing:
        raise ConfigError(f"{path}: {len(missing)} tensor(s) of {what} are missing, e.g. "
                          f"{missing[0]!r}; a partial adapter would merge as the untrained "
                          "base there")
    for name, tensor in saved.items():
        want = expected_or_optional[name]
        if tensor.shape != want.shape:
            raise ConfigError(f"{path}: {name!r} has shape {tuple(tensor.shape)}, but {what} "
                              f"needs {tuple(want.shape)}")
        if (tensor.is_floating_point() != want.is_floating_point()
                or (not want.is_floating_point() and tensor.dtype != want.dtype)):
            raise ConfigError(f"{path}: {name!r} holds {tensor.dtype}, but {what} needs "
                              f"{want.dtype}")
