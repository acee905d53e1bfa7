"""SHA-256 of files, read in chunks (checkpoint manifests, data and base fingerprints)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

_CHUNK_BYTES = 8 * 2**20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def files_under(path: Path) -> list[Path]:
    """``path`` itself if it is a file, else every file below it (hidden names skipped:
    editors' and memfit's own temporary files), sorted; ``[]`` if it does not exist."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    return sorted(file for file in path.rglob("*") if file.is_file()
                  and not any(part.startswith(".") for part in file.relative_to(path).parts))


def fingerprint(files: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """``{name: {"bytes", "sha256"}}`` of each named file."""
    return {name: {"bytes": file.stat().st_size, "sha256": sha256_file(file)}
            for name, file in files.items()}


def fingerprint_changes(recorded: dict[str, dict[str, Any]],
                        current: dict[str, dict[str, Any]]) -> list[str]:
    """What differs, one short phrase per file, e.g. ``rows.jsonl (contents)``."""
    changes = []
    for file in sorted(recorded.keys() | current.keys()):
        before, after = recorded.get(file), current.get(file)
        if after is None:
            changes.append(f"{file} (removed)")
        elif before is None:
            changes.append(f"{file} (added)")
        elif before != after:
            what = "size" if before["bytes"] != after["bytes"] else "contents"
            changes.append(f"{file} ({what})")
    return changes
