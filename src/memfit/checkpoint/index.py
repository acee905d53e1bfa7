"""``checkpoints/index.json``: the step folders this run saved, so that pruning
(``train.keep_checkpoints``) and re-saving a step only ever remove what memfit wrote —
never a folder the user put in ``checkpoints/`` by hand::

    {"format": 1, "saved": ["step-3", "step-6"]}
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from memfit._utils.atomic import write_text
from memfit._utils.errors import CheckpointError
from memfit.checkpoint.manifest import STEP_FOLDER

INDEX_FILE = "index.json"
FORMAT_VERSION = 1


def saved_by_this_run(root: Path) -> list[str]:
    """The step folder names ``checkpoints/index.json`` under ``root`` lists, oldest first."""
    path = root / INDEX_FILE
    if not path.is_file():
        return []
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError):
        raw = None
    names = raw.get("saved") if isinstance(raw, dict) and raw.get("format") == FORMAT_VERSION \
        else None
    if not (isinstance(names, list)
            and all(isinstance(name, str) and STEP_FOLDER.match(name) for name in names)):
        raise CheckpointError(
            f"{path} is not a memfit checkpoint index (format {FORMAT_VERSION}, \"saved\": "
            "[\"step-N\", ...]); restore it, or move it away and memfit keeps every "
            "existing checkpoint")
    return sorted(set(names), key=lambda name: int(name.removeprefix("step-")))


def _write(root: Path, names: list[str]) -> None:
    write_text(root / INDEX_FILE, json.dumps({"format": FORMAT_VERSION, "saved": names}))


def claim(final: Path) -> None:
    """Record ``final`` (``checkpoints/step-N``) as this run's before it is renamed into
    place, so a kill in between leaves at most an entry without a folder."""
    names = saved_by_this_run(final.parent)
    if final.name not in names:
        _write(final.parent, [*names, final.name])


def refuse_foreign(final: Path) -> None:
    """CheckpointError, before anything is written, when ``final`` exists and this run
    did not save it."""
    if final.exists() and final.name not in saved_by_this_run(final.parent):
        raise CheckpointError(f"{final} exists and was not saved by this run; move it out of "
                              f"{final.parent} (memfit never replaces folders it did not write)")


def _delete(folder: Path) -> None:
    """Renamed to a staging name first: a kill mid-delete leaves a folder that
    ``remove_stale_staging`` clears, never a half-deleted ``step-N``."""
    retired = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old."))
    os.rename(folder, retired / folder.name)
    shutil.rmtree(retired)


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` step folders this run saved; folders it did not
    save are never touched (nor counted)."""
    names = saved_by_this_run(root)
    removed = names[:-keep]
    for name in removed:
        if (root / name).is_dir():
            _delete(root / name)
    if removed:
        _write(root, [name for name in names if name not in removed])
