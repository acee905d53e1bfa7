"""What the base model was when a run started: the size and SHA-256 of each file it is
built from, so that a resume can refuse to continue on weights that changed underneath it
(the adapters or optimizer state would be glued onto another model without a word).

Files are named relative to ``model.path`` (an unchanged copy of the folder elsewhere has
the same fingerprint, and may be named on resume); a factory given as ``file.py:name`` adds
that file, since it builds the base. Presets and importable modules are built from code and
the seed alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memfit._utils.hashing import files_under, fingerprint
from memfit.config.schema import ModelConfig

BASE_FILE = "base.json"


def base_fingerprint(model: ModelConfig) -> dict[str, dict[str, Any]]:
    """``{name: {"bytes", "sha256"}}`` of the base's files (``{}`` for presets)."""
    files: dict[str, Path] = {}
    if model.path:
        folder = Path(model.path)
        files.update({str(file.relative_to(folder)) if file != folder else folder.name: file
                      for file in files_under(folder)})
    if model.factory and model.factory.rpartition(":")[0].endswith(".py"):
        factory = Path(model.factory.rpartition(":")[0])
        if factory.is_file():
            files[f"model.factory {factory.name}"] = factory
    return fingerprint(files)
