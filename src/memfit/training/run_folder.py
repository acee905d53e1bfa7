"""The run folder: created atomically, owned by one process at a time, never mixed with
what a user had there.

- A new run gets a folder nobody else has: ``mkdir`` without ``exist_ok`` (a default
  ``runs/<date>-<time>`` name takes a ``-2``, ``-3`` ... suffix when two runs start in the
  same second), and a marker file saying memfit made it.
- ``train.output_dir`` naming an existing folder is accepted only when it is empty, or is
  a memfit run that stopped before its first checkpoint (it then starts again: only the
  files memfit writes are removed). A folder with anything else in it is refused before
  the model is built, and so is one that cannot be created.
- While a process trains in a run folder it holds an exclusive ``flock`` on the folder's
  lock file, so a second ``train`` or ``--resume`` on a live run is refused in one line.
  The kernel drops the lock when the process dies, however it dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import sys
import time
from pathlib import Path

from memfit._utils.atomic import leftovers_of, write_text
from memfit._utils.errors import ConfigError
from memfit._utils.folders import RUN_MARKER, creation_problem, enclosing_checkpoint
from memfit._utils.no_follow import (
    FILE,
    FOLDER,
    check_layout,
    link_message,
    open_no_follow,
    remove_entry,
)
from memfit._utils.version import VERSION
from memfit.checkpoint.folders import checkpoint_folders
from memfit.checkpoint.state import RUN_RECORDS

MARKER_FILE = RUN_MARKER
LOCK_FILE = ".memfit.lock"
DEFAULT_RUNS = Path("runs")  # where a run without train.output_dir gets a dated folder
# What a run writes before its first checkpoint: removed when such a run starts again.
_WRITTEN_BEFORE_FIRST_CHECKPOINT = (*RUN_RECORDS, "adapters.txt", "adapters.json",
                                    "metrics.jsonl", "tensorboard", "memory.png", "checkpoints")
# Every entry memfit writes in a run folder (a folder before what it holds): each must be
# the real file or folder, never a link, before a run writes there (memfit.report writes
# report.html; checkpoints/step-N folders are checkpoint.folders').
RUN_LAYOUT = {LOCK_FILE: FILE, MARKER_FILE: FILE, **dict.fromkeys(RUN_RECORDS, FILE),
              "adapters.txt": FILE, "adapters.json": FILE, "metrics.jsonl": FILE,
              "summary.json": FILE, "memory.png": FILE, "report.html": FILE,
              "tensorboard": FOLDER, "checkpoints": FOLDER, "checkpoints/index.json": FILE,
              "adapter": FOLDER, "model": FOLDER}


def is_run_folder(folder: Path) -> bool:
    """A folder memfit made: it carries the marker memfit wrote when it created the run (a
    regular file, not a link to one). Files named like a run's (config.yaml,
    metrics.jsonl, checkpoints/) do not make a folder a run: another tool writes those
    names too, and memfit would then replace or delete that tool's files."""
    try:
        return stat.S_ISREG(os.lstat(folder / MARKER_FILE).st_mode)
    except OSError:  # missing, or folder is no folder
        return False


def _has_progress(folder: Path) -> bool:
    """True once a run has something worth resuming or keeping: a checkpoint or a result."""
    results = ("summary.json", "adapter", "model")
    return bool(checkpoint_folders(folder)) or any(
        os.path.lexists(folder / name) for name in results)


def check_new_run_folder(output_dir: str | None) -> None:
    """Refuse, before anything is built or written, a ``train.output_dir`` that a new run
    could not own: a link, a file, a folder holding other things, a run with progress, or
    a path that cannot be created."""
    if not output_dir:
        # A default name is created under runs/ of the working directory, which may be
        # read-only (a container's /, /proc) or not ours.
        problem = creation_problem(DEFAULT_RUNS / "new")
        if problem is not None:
            raise ConfigError(f"the default run folder {DEFAULT_RUNS}/ (train.output_dir unset) "
                              f"cannot be created in {Path.cwd()}: {problem}; set "
                              "train.output_dir to a writable place")
        return
    folder = Path(output_dir)
    key = f"train.output_dir={output_dir}"
    checkpoint = enclosing_checkpoint(folder)
    if checkpoint is not None:
        raise ConfigError(f"{key} is inside the checkpoint folder {checkpoint}, which holds "
                          "only what its manifest.json lists; choose another folder")
    if folder.is_symlink():  # the lock, the marker and every file would land in its target
        raise ConfigError(f"{key}: {link_message(folder)}")
    if folder.exists():
        if not folder.is_dir():
            raise ConfigError(f"{key} is a file, not a folder; choose a new or empty folder")
        if is_run_folder(folder):
            if _has_progress(folder):
                raise ConfigError(f"{key} already holds a run; resume it with --resume "
                                  f"{output_dir} or choose another folder")
            return  # stopped before its first checkpoint: create_run_folder restarts it
        contents = sorted(path.name for path in folder.iterdir() if path.name != LOCK_FILE)
        if contents:
            shown = ", ".join(contents[:3]) + (", ..." if len(contents) > 3 else "")
            raise ConfigError(f"{key} already exists and is not a memfit run folder (it holds "
                              f"{shown}, but no {MARKER_FILE}); choose a new or empty folder")
        return
    problem = creation_problem(folder)
    if problem is not None:
        raise ConfigError(f"{key} cannot be created: {problem}")


def refuse_run_inside_data(output_dir: str | None, data_paths: dict[str, str | None]) -> None:
    """A new run's folder inside a data folder (``{key: path}``) would be read back as data
    by the next run (format "images" walks its folder's subfolders: memory.png is an image)
    and would change the data's fingerprint, so no resume would be accepted."""
    folder = Path(output_dir) if output_dir else DEFAULT_RUNS
    named = (f"train.output_dir={output_dir}" if output_dir
             else "the default run folder runs/ (train.output_dir unset)")
    for key, data in data_paths.items():
        if data and Path(data).is_dir() and folder.resolve().is_relative_to(Path(data).resolve()):
            raise ConfigError(f"{named} is inside {key} {data}: the run's files would be read "
                              f"as data; choose a train.output_dir outside {data}")


class RunFolder:
    """A run folder this process holds the lock on (released by ``close`` or at exit)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            # O_NOFOLLOW: a lock file linked to a user's file must not be truncated below.
            descriptor = open_no_follow(path / LOCK_FILE, os.O_RDWR | os.O_CREAT)
        except OSError as error:  # a read-only mount, a folder that is not ours
            raise ConfigError(f"{path} cannot be written ({error.strerror}); a run needs its "
                              "folder writable to record progress") from None
        handle = os.fdopen(descriptor, "r+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "another process"
            handle.close()
            raise ConfigError(f"{path} is in use by a running memfit ({owner}); wait for it to "
                              "finish or stop it, or choose another folder") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        self._lock = handle

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases the flock
            self._lock = None


def _make_folder(output_dir: str | None) -> Path:
    """Create the folder a new run owns; a default name takes a suffix on collision."""
    if output_dir:
        folder = Path(output_dir)
        with contextlib.suppress(FileExistsError):  # empty, or a run to restart: checked
            folder.mkdir(parents=True)
        if folder.is_symlink():  # made since check_new_run_folder looked
            raise ConfigError(f"train.output_dir={output_dir}: {link_message(folder)}")
        return folder
    stem = DEFAULT_RUNS / time.strftime("%Y%m%d-%H%M%S")
    stem.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        folder = stem if attempt == 1 else stem.with_name(f"{stem.name}-{attempt}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise ConfigError(f"could not create a new run folder next to {stem}; set train.output_dir")


def create_run_folder(output_dir: str | None) -> RunFolder:
    """Create (or take over an empty / restartable) run folder, lock it and mark it."""
    folder = _make_folder(output_dir)
    run = RunFolder(folder)
    try:
        check_new_run_folder(output_dir)  # again, now under the lock
        if is_run_folder(folder):
            _remove_unfinished_start(folder)
        check_layout(folder, RUN_LAYOUT)
        write_text(folder / MARKER_FILE, json.dumps(
            {"memfit_version": VERSION,
             "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=2))
    except BaseException:
        run.close()
        raise
    return run


def _remove_unfinished_start(folder: Path) -> None:
    print(f"memfit: {folder} holds a run that stopped before its first checkpoint; "
          "starting it again", file=sys.stderr)
    for name in _WRITTEN_BEFORE_FIRST_CHECKPOINT:
        # The run's own record is discarded anyway: a link planted under one of these
        # names is removed itself (its target is left alone), so the restart can proceed.
        remove_entry(folder / name)


# What a kill leaves of the run folder's own atomic writes: the export being staged or
# swapped, temporary files of its JSON/YAML records. Checkpoints' are memfit.checkpoint's.
_STALE_STAGING = leftovers_of(r"adapter|model|[\w-]+\.(?:json|jsonl|yaml|txt)")


def open_run_folder(path: str | Path) -> RunFolder:
    """Lock an existing run folder for ``--resume`` and remove what a killed export left;
    ConfigError, before anything is written, when one of memfit's entries in it is a link
    or of the wrong kind."""
    folder = Path(path)
    if not folder.is_dir() or not is_run_folder(folder):
        raise ConfigError(f"--resume {path}: not a memfit run folder (no {MARKER_FILE} there)")
    check_layout(folder, RUN_LAYOUT)
    run = RunFolder(folder)
    for stale in folder.iterdir():
        # A link under a staging name is not what a killed save left: left alone.
        if _STALE_STAGING.match(stale.name) and not stale.is_symlink():
            remove_entry(stale)
    return run
