"""The checkpoints of a run folder: ``checkpoints/step-N/``, which one to resume from, and
the half-written staging folders a killed save leaves behind."""

from __future__ import annotations

import sys
from pathlib import Path

from memfit._utils.atomic import leftovers_of
from memfit._utils.errors import CheckpointError
from memfit._utils.no_follow import own_folder, remove_entry
from memfit.checkpoint.manifest import STEP_FOLDER, DamagedCheckpoint, verify_checkpoint

# What a killed save leaves in checkpoints/ (memfit._utils.atomic); nothing else there is
# ever removed as stale.
_STAGING_FOLDER = leftovers_of(r"step-\d+")


def checkpoints_root(run_dir: Path) -> Path:
    """``run_dir/checkpoints``, created if missing. ConfigError when it is a link (or not a
    folder): saving, pruning and cleaning up would then happen in whatever it points at."""
    return own_folder(run_dir / "checkpoints")


def _real_root(run_dir: Path) -> Path | None:
    """``run_dir/checkpoints`` when it is a real folder. A link there is not memfit's: no
    checkpoint is read or cleaned up through it (a run refuses it before writing)."""
    root = run_dir / "checkpoints"
    return root if root.is_dir() and not root.is_symlink() else None


def checkpoint_folders(run_dir: Path) -> list[Path]:
    """The ``checkpoints/step-N`` folders of ``run_dir``, oldest first, intact or not. A
    link named ``step-N`` is not one: a checkpoint is a folder memfit wrote there."""
    root = _real_root(run_dir)
    if root is None:
        return []
    found = [(int(match.group(1)), path) for path in root.iterdir()
             if (match := STEP_FOLDER.match(path.name)) and path.is_dir()
             and not path.is_symlink()]
    return [path for _, path in sorted(found)]


def newest_intact_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint whose files match its manifest; None when there is none at
    all. Each newer damaged one gets one warning line on stderr; CheckpointError when
    checkpoints exist but none is intact."""
    damaged: list[DamagedCheckpoint] = []
    for folder in reversed(checkpoint_folders(run_dir)):
        try:
            verify_checkpoint(folder)
        except DamagedCheckpoint as error:
            damaged.append(error)
            continue
        for error in damaged:
            print(f"memfit: warning: {error}; falling back to {folder}", file=sys.stderr)
        return folder
    if not damaged:
        return None
    reasons = "; ".join(f"{error.folder.name}: {error.reason}" for error in damaged)
    raise CheckpointError(f"no intact checkpoint under {run_dir / 'checkpoints'} ({reasons}); "
                          "memfit trains only on checkpoints that match their manifest.json")


def remove_stale_staging(run_dir: Path) -> list[Path]:
    """Remove what a killed save left in ``checkpoints/`` (staging folders only); returns
    what was removed. Call only while holding the run: a live run's save is staged too."""
    root = _real_root(run_dir)
    if root is None:
        return []
    stale = [path for path in sorted(root.iterdir())
             if _STAGING_FOLDER.match(path.name) and path.is_dir() and not path.is_symlink()]
    for path in stale:
        remove_entry(path)
    return stale
