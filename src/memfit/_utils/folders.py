"""Can a folder be created here? Asked before any work whose result goes there, so a
long job never ends by failing to write. Is a path inside a checkpoint? And the marker a
memfit run folder carries."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Written into a run folder when memfit creates it (memfit.training.run_folder); what makes
# a folder a memfit run, here so that data readers can skip run folders too.
RUN_MARKER = "memfit-run.json"


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def creation_problem(folder: Path) -> str | None:
    """Why ``folder`` (which does not exist yet) could not be created, or None."""
    parent = _nearest_existing(folder.parent)
    if not parent.is_dir():
        return f"{parent} is a file, not a folder"
    try:  # the only sure test (root ignores mode bits; /proc and read-only mounts refuse)
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".memfit-probe-"))
    except OSError as error:
        return f"cannot create a folder in {parent}: {error.strerror}"
    return None


def enclosing_checkpoint(path: Path) -> Path | None:
    """The memfit checkpoint folder (``checkpoints/step-N`` with its ``manifest.json``) that
    ``path`` is or lies inside, or None. Anything written there makes the checkpoint hold
    a file its manifest does not list: the next resume calls it damaged."""
    for folder in (path.absolute(), *path.absolute().parents):
        if folder.parent.name == "checkpoints" and (folder / "manifest.json").is_file():
            return folder
    return None
