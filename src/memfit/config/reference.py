"""The config reference, generated from the schema's field docs: used by
``memfit train --help`` and written to docs/config.md (``python -m memfit.config.reference``).
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Iterator
from enum import Enum

from memfit.config.load import to_mapping
from memfit.config.schema import Config


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    key: str
    type_name: str
    default: str
    help: str


def _type_name(hint: typing.Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return " | ".join(member.value for member in hint)
    if origin is tuple:
        return "list of " + _type_name(args[0])
    if origin is dict:
        return "mapping"
    if args:  # a union
        return " | ".join("null" if arg is type(None) else _type_name(arg) for arg in args)
    return getattr(hint, "__name__", str(hint))


def key_docs(cls: type = Config, prefix: str = "") -> Iterator[KeyDoc]:
    hints = typing.get_type_hints(cls)
    defaults = cls()
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            yield from key_docs(hint, f"{prefix}{field.name}.")
            continue
        default = to_mapping(getattr(defaults, field.name))
        text = field.metadata["help"]
        if "limits" in field.metadata:  # config/limits.py refuses values outside them
            low, high = field.metadata["limits"]
            text = f"{text} Accepted: {low:,} to {high:,}."
        yield KeyDoc(f"{prefix}{field.name}", _type_name(hint),
                     "null" if default is None else str(default), text)


def help_text() -> str:
    lines = ["configuration keys (YAML sections, or section.key=value on the command line):"]
    for item in key_docs():
        lines.append(f"  {item.key} ({item.type_name}; default {item.default})")
        lines.append(f"      {item.help}")
    return "\n".join(lines)


def markdown() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from `src/memfit/config/schema.py` by "
        "`python -m memfit.config.reference > docs/config.md`; a test keeps it in sync.",
        "",
        "Write keys as YAML sections or as `section.key=value` overrides after the config "
        "file. Relative paths in a YAML file are resolved against that file's folder.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for item in key_docs():
        type_name = item.type_name.replace("|", "\\|")  # a bare | would split the cell
        lines.append(f"| `{item.key}` | {type_name} | `{item.default}` | {item.help} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
