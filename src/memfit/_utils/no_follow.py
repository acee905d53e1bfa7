"""Open, create and remove entries of folders memfit owns (run folders, ``memfit bench``
folders) without ever following a symbolic link.

Run folders are passed between people. A link planted where memfit writes its own file
(``metrics.jsonl`` -> ``~/.bashrc``) or folder (``checkpoints`` -> ``~/thesis``) would
otherwise make memfit truncate, overwrite or delete what the link points at. Every entry
memfit writes is therefore checked with ``lstat`` or opened with ``O_NOFOLLOW``: a link, or
an entry of the wrong kind (a FIFO where a file belongs, which would block forever), is
refused in one line naming it. A delete removes a link itself, never its target.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path

from memfit._utils.errors import ConfigError

FILE, FOLDER = "file", "folder"


def link_message(path: Path | str) -> str:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return (f"{path} is a symbolic link{target}; memfit never writes through a link: remove "
            "the link (its target is left alone) or put a real file or folder there")


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a file" if stat.S_ISREG(mode) else "not a regular file"


def check_entry(path: Path, kind: str) -> bool:
    """True when ``path`` exists as a real (not linked) ``kind`` (FILE or FOLDER), False when
    nothing is there; ConfigError for a link or an entry of another kind."""
    try:
        found = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(found):
        raise ConfigError(link_message(path))
    wanted = stat.S_ISDIR(found) if kind == FOLDER else stat.S_ISREG(found)
    if not wanted:
        raise ConfigError(f"{path} is {_kind_of(found)}, where memfit keeps its own {kind}; "
                          "move it away")
    return True


def check_layout(root: Path, entries: Mapping[str, str]) -> None:
    """``check_entry`` for each ``{relative path: FILE or FOLDER}`` under ``root`` (a folder
    before the entries inside it), before anything is written there."""
    for name, kind in entries.items():
        check_entry(root / name, kind)


def open_no_follow(path: Path, flags: int, mode: int = 0o666) -> int:
    """``os.open`` that refuses a link (``O_NOFOLLOW``) and anything but a regular file, in
    one line; ``mode`` is masked by the umask as with a plain ``open()``. Opened for
    writing, a file with other (hard-linked) names is refused too: writing it in place
    would change the file behind those names."""
    # O_NONBLOCK: opening a FIFO for writing would otherwise wait for a reader forever.
    try:
        descriptor = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ConfigError(link_message(path)) from None
        if error.errno == errno.ENXIO:  # a FIFO without a reader
            raise ConfigError(f"{path} is a FIFO, where memfit keeps its own file; move it "
                              "away") from None
        raise
    found = os.fstat(descriptor)
    problem = None if stat.S_ISREG(found.st_mode) else _kind_of(found.st_mode)
    if problem is None and flags & (os.O_WRONLY | os.O_RDWR) and found.st_nlink > 1:
        problem = f"a file with {found.st_nlink - 1} other hard-linked name(s)"
    if problem is not None:
        os.close(descriptor)
        raise ConfigError(f"{path} is {problem}, where memfit keeps its own file; move it "
                          "away")
    fcntl.fcntl(descriptor, fcntl.F_SETFL,
                fcntl.fcntl(descriptor, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return descriptor


def own_folder(path: Path) -> Path:
    """Create the folder ``path`` (its parent exists), or accept it when it already is a
    real folder; never a link to one."""
    try:
        os.mkdir(path)  # 0o777 masked by the umask, as a plain mkdir gives
    except FileExistsError:
        check_entry(path, FOLDER)
    return path


def remove_entry(path: Path) -> None:
    """Remove a file or a whole folder; a link is removed itself, never what it points at
    (``shutil.rmtree`` does not follow the links inside a folder either)."""
    try:
        found = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(found):
        shutil.rmtree(path)
    else:
        os.unlink(path)
