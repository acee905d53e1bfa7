"""Byte sizes as users write them (24GiB, 512MiB, 16GB, 1e9) and as we print them."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int | float) -> int:
    """``"24GiB"`` -> 25769803776. Raises ValueError naming the accepted units."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _whole(text, text)
    match = _PATTERN.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{text!r} is not a size; write a number with an optional unit "
            "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 24GiB"
        )
    return _whole(float(match.group(1)) * _UNITS[unit], text)


def _whole(count: float, text: object) -> int:
    # "1e400GiB" reads as inf, which int() cannot take (OverflowError, not ValueError).
    if not math.isfinite(count):
        raise ValueError(f"{text!r} is not a finite size")
    return int(count)


def format_bytes(count: float) -> str:
    """Binary units, as everywhere in memfit: 1536 -> '1.50 KiB'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= size:
            return f"{count / size:.2f} {unit}"
    return f"{int(count)} B"
