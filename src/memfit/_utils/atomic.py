"""Write files and folders so that a crash never leaves a half-written one behind:
everything goes to a temporary name in the same folder first, then is renamed.

The final name is never followed when it is a link: a file replaces only a real file
(a link there is refused in one line), a folder replaces what was there, a link included,
whose target is left alone. What is written gets the mode a plain ``open()``/``mkdir()``
would give under the user's umask, whatever the writing library chose (safetensors writes
0600). Temporary names stay within the file system's 255 bytes however long the final
name is.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from memfit._utils.no_follow import FILE, check_entry

# tempfile's random part of the names below (``tempfile._RandomNameSequence``).
_RANDOM = r"[a-z0-9_]{8}"
# The longest visible part of a temporary name: with ".", ".old." or ".", 8 random
# characters and ".tmp" it stays under the 255 bytes file systems allow in a name.
_VISIBLE_BYTES = 200
_KEPT_END_BYTES = 60


def _cut(text: str, limit: int, from_end: bool = False) -> str:
    """The first (or last) characters of ``text`` that fit ``limit`` bytes of UTF-8."""
    encoded = text.encode("utf-8", "surrogateescape")
    part = encoded[-limit:] if from_end else encoded[:limit]
    return part.decode("utf-8", "ignore")


def visible_name(name: str) -> str:
    """``name`` as shown in its temporary names: the whole name, or for a long one its
    start and its end (which keeps the extension), the middle dropped. A name matched by
    a pattern like ``step-\\d+`` or ``[\\w-]+\\.json`` still matches once cut, so
    ``leftovers_of`` recognises the leftovers of long names too."""
    if len(name.encode("utf-8", "surrogateescape")) <= _VISIBLE_BYTES:
        return name
    return (_cut(name, _VISIBLE_BYTES - _KEPT_END_BYTES)
            + _cut(name, _KEPT_END_BYTES, from_end=True))


def leftovers_of(names: str) -> re.Pattern[str]:
    """What a kill can leave of this module's writes to files or folders whose names match
    the regular expression ``names``: a staged folder (``.NAME.<8>``), an old one moved
    aside (``.NAME.old.<8>``) or a temporary file (``.NAME.<8>.tmp``), NAME cut as
    ``visible_name`` cuts it."""
    return re.compile(rf"^\.(?:{names})\.(?:old\.)?{_RANDOM}(?:\.tmp)?$")


def _default_mode(directory: bool) -> int:
    """The mode a plain open()/mkdir() would give under the current umask (tempfile's
    private 0600/0700 would otherwise survive the rename)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def replace_file(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Call ``write`` on a temporary file beside ``path``, then rename it over ``path``.
    ConfigError, before anything is written, when ``path`` is a link or not a regular
    file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    check_entry(path, FILE)
    handle = tempfile.NamedTemporaryFile("wb", dir=path.parent,
                                         prefix=f".{visible_name(path.name)}.", suffix=".tmp",
                                         delete=False)
    temporary = Path(handle.name)
    try:
        with handle:
            write(handle)
        os.chmod(temporary, _default_mode(directory=False))
        os.replace(temporary, path)  # replaces the name itself, never what a link names
    except BaseException:  # a full disk, a kill: leave no temporary file behind
        temporary.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    replace_file(path, lambda handle: handle.write(text.encode("utf-8")))


def _give_default_modes(folder: Path) -> None:
    """Every file and folder under ``folder`` (links skipped) to ``_default_mode``."""
    files, folders = _default_mode(directory=False), _default_mode(directory=True)
    os.chmod(folder, folders)
    for parent, subfolders, names in os.walk(folder):  # does not descend into links
        for name in subfolders + names:
            path = os.path.join(parent, name)
            found = os.lstat(path).st_mode
            if not stat.S_ISLNK(found):
                os.chmod(path, folders if stat.S_ISDIR(found) else files)


@contextlib.contextmanager
def staged_folder(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to fill; on success it replaces ``final``. An old
    ``final`` is moved aside before the new one is renamed into place, so a kill at any
    moment leaves one complete folder (or both, the old one under a dot-name). A link at
    ``final`` is moved aside and removed like a folder would be: the link itself, never
    its target."""
    final.parent.mkdir(parents=True, exist_ok=True)
    visible = visible_name(final.name)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{visible}."))
    os.chmod(staging, _default_mode(directory=True))
    try:
        yield staging
        _give_default_modes(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if not os.path.lexists(final):
        os.rename(staging, final)
        return
    retired = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{visible}.old."))
    os.rename(final, retired / final.name)
    os.rename(staging, final)
    shutil.rmtree(retired)
