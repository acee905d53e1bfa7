"""What the data files were when a run started: each file's size and SHA-256, so that a
resume can refuse to continue on data that changed underneath it (the batch stream would
silently draw other examples at the same positions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memfit._utils.hashing import files_under, fingerprint


def data_fingerprint(paths: list[str | None]) -> dict[str, dict[str, Any]]:
    """``{file: {"bytes", "sha256"}}`` for every file under the given data paths."""
    return fingerprint({str(file): file for path in paths if path
                        for file in files_under(Path(path))})
