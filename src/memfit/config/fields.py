"""``doc``: how every key of the schema is declared (a module of its own, so that the
sections kept in files beside schema.py, and the option blocks of the parts above the
config floor, declare theirs the same way); ``own_keys``: the field of a section that holds
the keys its parts declare for themselves."""

from __future__ import annotations

from dataclasses import field


def doc(text: str, limits: tuple[float, float] | None = None, **kwargs):
    """A dataclass field whose help text feeds `--help` and docs/config.md; ``limits``: the
    lowest and highest value accepted (config/limits.py checks the schema's whole numbers,
    an option block's owner its own)."""
    metadata = {"help": text} if limits is None else {"help": text, "limits": limits}
    return field(metadata=metadata, **kwargs)


def own_keys(text: str):
    """A section's field for the keys its parts declare in blocks of their own (an
    optimizer spec's options): written and read as keys of the section itself
    (``optimizer.momentum``, never ``optimizer.own``), kept as given by load.py and checked
    by the part that declares them."""
    # Not hashed (a dict cannot be): sections are hashed as cache keys (the planner's), and
    # equality, which compares it, keeps configs with different own keys apart.
    return field(metadata={"help": text, "own_keys": True}, default_factory=dict, hash=False)


def is_own_keys(entry) -> bool:
    """Whether a dataclass field is a section's ``own_keys`` field."""
    return bool(entry.metadata.get("own_keys"))
