"""YAML + ``section.key=value`` overrides -> a typed, frozen ``Config`` (validated by
memfit.techniques.config_checks, which asks the specs too).

Unknown keys get a did-you-mean, wrong types name the key and the expected type, and
closed choices list the valid values. Conversion is driven by the dataclass type hints
in ``schema.py``, so adding a key there is all it takes to make it loadable.
"""

from __future__ import annotations

import bisect
import dataclasses
import difflib
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from memfit._utils.errors import ConfigError
from memfit.config.fields import is_own_keys
from memfit.config.limits import MAX_CONFIG_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES
from memfit.config.schema import Config

# Keys holding filesystem paths: relative values written in a YAML file are resolved
# against that file's folder, so a config and its data can travel together.
PATH_KEYS = {("model", "path"), ("data", "path"), ("data", "eval_path")}
FILE_REFERENCE_KEYS = (("model", "factory"), ("model", "loss"), ("optimizer", "name"))


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; malformed or non-mapping files are one-line ConfigErrors."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is {size:,} bytes, beyond memfit's limit of "
                          f"{MAX_CONFIG_BYTES:,} for a config file")
    try:
        loaded = _load_yaml(path.read_text(encoding="utf-8"))
    except _Refused as error:
        raise ConfigError(f"config file {path} is refused: {error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        raise ConfigError(f"config file {path} is not valid YAML{where}: {problem}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"config file {path} must be a mapping of sections (model:, data:, ...), "
            f"not a {type(loaded).__name__}"
        )
    _resolve_relative_paths(loaded, path.parent)
    return loaded


def _resolve_relative_paths(raw: dict[str, Any], base: Path) -> None:
    for section, key in PATH_KEYS:
        block = raw.get(section)
        if isinstance(block, dict) and isinstance(block.get(key), str):
            block[key] = _resolve(block[key], base)
    # 'path/to/file.py:name' references name a file too.
    for section, key in FILE_REFERENCE_KEYS:
        block = raw.get(section)
        if isinstance(block, dict) and isinstance(block.get(key), str):
            file, sep, name = block[key].rpartition(":")
            if sep and file.endswith(".py"):
                block[key] = f"{_resolve(file, base)}:{name}"


def _resolve(path: str, base: Path) -> str:
    value = Path(path).expanduser()
    return str(value) if value.is_absolute() else str((base / value).resolve())


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["train.max_steps=10", "adapter.kind=lora"]`` -> nested mapping.

    Values are parsed as YAML scalars/lists (``true``, ``1e-4``, ``[q_proj, v_proj]``);
    one that YAML reads as a plain string is taken exactly as written (see
    ``_override_value``).
    """
    nested: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {pair!r} must look like section.key=value")
        value = _override_value(pair, text)
        parts = key.strip().split(".")
        node = nested
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {pair!r} conflicts with an earlier value for {part}")
            node = child
        node[parts[-1]] = value
    return nested


def _override_value(pair: str, text: str) -> Any:
    """The value of one override: never a silently shortened or altered one.

    YAML drops what follows `` #`` as a comment and folds line breaks into spaces, so
    ``data.path=my #1.jsonl`` would read as ``my``. A value YAML reads as one plain string is
    therefore taken exactly as written after ``=`` (it was a string anyway). A number, a
    boolean, null, a list or a quoted string is YAML's, unless a comment or a folded line
    break would change it: that is refused, never guessed.
    """
    if not text.strip():
        return None
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"override {pair!r:.60}...: the value is {len(text):,} characters, "
                          f"beyond memfit's limit of {MAX_CONFIG_BYTES:,}")
    try:
        tokens = [token for token in yaml.scan(text)
                  if not isinstance(token, (yaml.StreamStartToken, yaml.StreamEndToken))]
    except yaml.YAMLError:
        return text  # not YAML at all: a string, as written
    if len(tokens) == 1 and isinstance(tokens[0], yaml.ScalarToken) and tokens[0].plain:
        try:
            value = _load_yaml(text)
        except _Refused:  # e.g. 2026-13-45, which YAML takes for a date
            return text
        # A number, a boolean or null is meant as one; anything else (a string, a date) is
        # the text exactly as written, comment-like "#..." and line breaks included.
        plain = value is None or isinstance(value, (bool, int, float))
        if not plain:
            return text
    else:
        try:
            value = _load_yaml(text)
        except _Refused as error:
            raise ConfigError(f"override {pair!r:.200} is refused: {error}") from None
        except yaml.YAMLError:
            return text
    _refuse_lossy_yaml(pair, text, tokens)
    return value


def _refuse_lossy_yaml(pair: str, text: str, tokens: list[yaml.Token]) -> None:
    """ConfigError when YAML would drop a comment from ``text`` or fold a line break in it
    (outside every token: a comment; a line break inside a scalar: folded)."""
    starts = [token.start_mark.index for token in tokens]
    for index in (i for i, character in enumerate(text) if character == "#"):
        before = bisect.bisect_right(starts, index) - 1  # the token starting at or before it
        if before < 0 or index >= tokens[before].end_mark.index:
            raise ConfigError(f"override {pair!r:.200}: YAML reads {text[index:]!r:.80} as a "
                              "comment and would drop it; quote the value (key='...') or remove "
                              "the comment")
    for token in tokens:
        source = text[token.start_mark.index:token.end_mark.index]
        if isinstance(token, yaml.ScalarToken) and "\n" in source:
            raise ConfigError(f"override {pair!r:.200}: YAML would fold the line break in "
                              f"{source!r:.80} into a space; write \\n inside double quotes "
                              "instead")


class _Refused(yaml.YAMLError):
    """A document memfit will not build: too deep, or too large once aliases expand."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses, while composing, a document nested deeper than
    MAX_YAML_DEPTH or holding more than MAX_YAML_NODES values once its aliases are
    expanded ("billion laughs": nine aliases of nine aliases of ... of a list).

    PyYAML builds an alias as a shared reference, so loading one is cheap; the expansion
    happens later, in everything that walks the values (conversion, comparison, writing
    config.yaml), and never ends. Aliases stay allowed (they are handy for sharing a
    list of targets between keys): each node's expanded size is computed once, from its
    children's, so the check itself stays linear in the file.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> values in it, aliases expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            target = self.anchors.get(anchor)
            if target is not None and id(target) not in self._sizes:  # still being composed
                raise _Refused(f"alias *{anchor} refers to a value that contains it")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise _Refused(f"it nests deeper than memfit's limit of {MAX_YAML_DEPTH} levels")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        else:
            children = node.value if isinstance(node, yaml.SequenceNode) else []
        size = 1 + sum(self._sizes[id(child)] for child in children)
        if size > MAX_YAML_NODES:
            raise _Refused(f"it holds more than memfit's limit of {MAX_YAML_NODES:,} values "
                           "once its aliases (*name) are expanded")
        self._sizes[id(node)] = size
        return node


def _load_yaml(text: str) -> Any:
    """``yaml.safe_load`` with memfit's bounds (``_BoundedLoader``)."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except ValueError as error:  # a date like 2026-13-45, an int of over 4,300 digits
        raise _Refused(f"a value cannot be read: {str(error).split(';')[0]}") from None
    finally:
        loader.dispose()


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge two raw mappings (``update`` wins); neither input is modified."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_raw(path: str | Path | None, overrides: list[str], base: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    """The mapping a config is built from: ``base`` (e.g. the demo) <- YAML file <- overrides.
    (memfit.techniques.config_checks builds and validates it.)"""
    raw = dict(base or {})
    if path is not None:
        raw = merge(raw, read_yaml(path))
    # Paths given on the command line are relative to where it runs; made absolute, so
    # the run's config.yaml still names the same files when resumed from elsewhere.
    given = parse_overrides(overrides)
    _resolve_relative_paths(given, Path.cwd())
    return merge(raw, given)


def to_mapping(config: Any) -> Any:
    """A Config (or any part of it) as plain YAML-ready values."""
    if dataclasses.is_dataclass(config):
        mapping = {}
        for entry in dataclasses.fields(config):
            value = to_mapping(getattr(config, entry.name))
            if is_own_keys(entry):  # written as keys of the section itself
                mapping.update(value)
            else:
                mapping[entry.name] = value
        return mapping
    if isinstance(config, Enum):
        return config.value
    if isinstance(config, tuple):
        return [to_mapping(item) for item in config]
    return config


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(to_mapping(config), sort_keys=False)


def build_unvalidated(cls: type, raw: Any, prefix: str = "") -> Any:
    """Convert and type-check every key of ``raw`` into ``cls`` without the cross-key
    rules of ``validate`` (the planner builds strategies no user asked for)."""
    where = prefix.rstrip(".") or "the config"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping of keys, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if not is_own_keys(f)}
    # A section with an own_keys field keeps the keys it does not know there, as given: the
    # parts that declare them check them (memfit.techniques.config_checks).
    own = next((f.name for f in dataclasses.fields(cls) if is_own_keys(f)), None)
    hints = typing.get_type_hints(cls)
    for key in raw:
        if key not in fields and own is None:
            raise ConfigError(unknown_key_message(f"{prefix}{key}", key, list(fields)))
    values: dict[str, Any] = {own: {}} if own is not None else {}
    for name, value in raw.items():
        if name in fields:
            values[name] = convert_value(hints[name], value, f"{prefix}{name}")
        else:
            values[own][name] = value
    return cls(**values)


def unknown_key_message(full_key: str, key: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(key, choices, n=1)
    hint = f"; did you mean {full_key[: -len(key)]}{close[0]}?" if close else ""
    return f"unknown key {full_key}{hint} (valid keys here: {', '.join(choices)})"


def convert_value(hint: Any, value: Any, key: str) -> Any:
    """Coerce one raw value to the type hint, or raise a ConfigError naming the key."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [arg for arg in args if arg is not type(None)]
        for option in options[:-1]:  # e.g. int | str: the first type that fits wins
            try:
                return convert_value(option, value, key)
            except ConfigError:
                continue
        return convert_value(options[-1], value, key)
    if dataclasses.is_dataclass(hint):
        return build_unvalidated(hint, value, prefix=f"{key}.")
    if isinstance(hint, type) and issubclass(hint, Enum):
        try:
            return hint(value)
        except ValueError:
            choices = ", ".join(member.value for member in hint)
            raise ConfigError(f"{key}={value!r} is not one of: {choices}") from None
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping of name: value, got {value!r}")
        return dict(value)
    if origin is tuple:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(convert_value(args[0], item, key) for item in value)
        if len(value) != len(args):
            raise ConfigError(f"{key} must be a list of {len(args)} values, got {value!r}")
        return tuple(convert_value(arg, item, key) for arg, item in zip(args, value, strict=True))
    return _convert_scalar(hint, value, key)


def _convert_scalar(hint: type, value: Any, key: str) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r:.200}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be a whole number, got {value!r:.200}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key} must be a number, got {value!r:.200}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key} must be a string, got {value!r:.200}")
    raise TypeError(f"config type {hint} of {key} has no converter")
