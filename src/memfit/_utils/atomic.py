"""Write files and folders so that a crash never leaves a half-written one behind:
everything goes to a temporary name in the same folder first, then is renamed."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

# tempfile's random part of the names below (``tempfile._RandomNameSequence``).
_RANDOM = r"[a-z0-9_]{8}"


def leftovers_of(names: str) -> re.Pattern[str]:
    """What a kill can leave of this module's writes to files or folders whose names match
    the regular expression ``names``: a staged folder (``.NAME.<8>``), an old one moved
    aside (``.NAME.old.<8>``) or a temporary file (``.NAME.<8>.tmp``)."""
    return re.compile(rf"^\.(?:{names})\.(?:old\.)?{_RANDOM}(?:\.tmp)?$")


def _default_mode(directory: bool) -> int:
    """The mode a plain open()/mkdir() would give under the current umask (tempfile's
    private 0600/0700 would otherwise survive the rename)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.",
                                         suffix=".tmp", delete=False, encoding="utf-8")
    temporary = Path(handle.name)
    try:
        with handle:
            handle.write(text)
        os.chmod(temporary, _default_mode(directory=False))
        os.replace(temporary, path)
    except BaseException:  # a full disk, a kill: leave no temporary file behind
        temporary.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def staged_folder(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to fill; on success it replaces ``final``. An old
    ``final`` is moved aside before the new one is renamed into place, so a kill at any
    moment leaves one complete folder (or both, the old one under a dot-name)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    os.chmod(staging, _default_mode(directory=True))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if not final.exists():
        os.rename(staging, final)
        return
    retired = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.old."))
    os.rename(final, retired / final.name)
    os.rename(staging, final)
    shutil.rmtree(retired)
