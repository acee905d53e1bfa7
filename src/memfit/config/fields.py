"""``doc``: how every key of the schema is declared (a module of its own, so that the
sections kept in files beside schema.py declare theirs the same way)."""

from __future__ import annotations

from dataclasses import field


def doc(text: str, limits: tuple[int, int] | None = None, **kwargs):
    """A dataclass field whose help text feeds `--help` and docs/config.md; ``limits``: the
    lowest and highest whole number accepted (config/limits.py checks them)."""
    metadata = {"help": text} if limits is None else {"help": text, "limits": limits}
    return field(metadata=metadata, **kwargs)
