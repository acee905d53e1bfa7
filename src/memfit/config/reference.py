"""The config reference, generated from the schema's field docs and the blocks of own keys
the parts above the config floor declare (``extra``: an optimizer's or a memory
technique's, which memfit.techniques.config_reference adds): used by ``memfit train
--help`` and written to docs/config.md.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable, Iterator
from enum import Enum

from memfit.config.fields import is_own_keys
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


def key_docs(cls: type = Config, prefix: str = "", owner: str = "") -> Iterator[KeyDoc]:
    """Every key of ``cls`` (a section, or a part's option block written under ``prefix``;
    ``owner`` starts each help text: whose key it is)."""
    hints = typing.get_type_hints(cls)
    defaults = cls()
    for field in dataclasses.fields(cls):
        if is_own_keys(field):  # the parts' own keys are documented by their blocks
            continue
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            yield from key_docs(hint, f"{prefix}{field.name}.")
            continue
        default = to_mapping(getattr(defaults, field.name))
        text = owner + field.metadata["help"]
        if "limits" in field.metadata:  # values outside them are refused at load
            low, high = field.metadata["limits"]
            text = f"{text} Accepted: {low:,} to {high:,}."
        yield KeyDoc(f"{prefix}{field.name}", _type_name(hint),
                     "null" if default is None else str(default), text)


def with_extra(extra: Iterable[KeyDoc]) -> list[KeyDoc]:
    """The schema's keys, each extra key after the last key of its section."""
    found = list(key_docs())
    for item in extra:
        section = item.key.rpartition(".")[0] + "."
        last = max(i for i, known in enumerate(found) if known.key.startswith(section))
        found.insert(last + 1, item)
    return found


def help_text(extra: Iterable[KeyDoc] = ()) -> str:
    lines = ["configuration keys (YAML sections, or section.key=value on the command line):"]
    for item in with_extra(extra):
        lines.append(f"  {item.key} ({item.type_name}; default {item.default})")
        lines.append(f"      {item.help}")
    return "\n".join(lines)


def markdown(extra: Iterable[KeyDoc] = ()) -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from `src/memfit/config/schema.py` and the own keys of the optimizers "
        "and memory techniques (their specs) by "
        "`python -m memfit.techniques.config_reference > docs/config.md`; a test keeps it "
        "in sync.",
        "",
        "Write keys as YAML sections or as `section.key=value` overrides after the config "
        "file. Relative paths in a YAML file are resolved against that file's folder.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for item in with_extra(extra):
        type_name = item.type_name.replace("|", "\\|")  # a bare | would split the cell
        lines.append(f"| `{item.key}` | {type_name} | `{item.default}` | {item.help} |")
    return "\n".join(lines) + "\n"
