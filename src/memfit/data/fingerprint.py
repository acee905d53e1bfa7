"""What the data files were when a run started: each file's size and SHA-256, so that a
resume can refuse to continue on data that changed underneath it (the batch stream would
silently draw other examples at the same positions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memfit._utils.hashing import sha256_file


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    return sorted(file for file in path.rglob("*") if file.is_file()
                  and not any(part.startswith(".") for part in file.relative_to(path).parts))


def data_fingerprint(paths: list[str | None]) -> dict[str, dict[str, Any]]:
    """``{file: {"bytes", "sha256"}}`` for every file under the given data paths."""
    return {str(file): {"bytes": file.stat().st_size, "sha256": sha256_file(file)}
            for path in paths if path for file in _files(Path(path))}


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
