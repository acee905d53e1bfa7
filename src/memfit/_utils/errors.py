"""Expected failures: the CLI prints their message as one line and exits 2.

Anything raised as a ``MemfitError`` is the user's to fix (a bad key, a missing file, an
impossible combination). The message must name the offending key/file/value and, where
there is a closed set, the valid choices. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator


class MemfitWarning(UserWarning):
    """Something the user should know and may act on (an ignored key, an out-of-memory
    retry, a skipped step): the CLI shows each as one ``memfit: warning:`` line, and hides
    other libraries' warnings unless ``--debug``."""


class MemfitError(Exception):
    """Base class for failures caused by the user's input; exit status 2."""

    exit_code = 2


class ConfigError(MemfitError):
    """A configuration key or value is unknown, mistyped or incompatible."""


class DataError(MemfitError):
    """A data file is missing, empty, or has rows without the fields its format needs."""


class ModelError(MemfitError):
    """A model folder, preset or factory cannot be loaded."""


class OutOfMemoryPlanError(MemfitError):
    """Training ran out of memory and no smaller plan fits the budget."""


class CheckpointError(MemfitError):
    """A checkpoint is damaged, incomplete, or holds something memfit refuses to load."""


class Stopped(MemfitError):
    """A requested stop (a signal) after saving: not a failure, so the CLI prints it without
    "error:"; the exit status is the shell's for that signal."""


class TrainingDiverged(MemfitError):
    """The loss or the gradient norm became non-finite; exit status 3."""

    exit_code = 3


def exception_chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and every exception it was raised from or while handling, outermost first."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_disk_full(error: BaseException) -> bool:
    """True when ``error`` (or an exception it was raised from) is the disk running out of
    space. torch.save reports it as a RuntimeError whose context is the OSError, and
    safetensors in the message of its own error type ("os error 28")."""
    return any((isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT))
               or "No space left on device" in str(seen) for seen in exception_chain(error))


def first_line(error: BaseException, limit: int = 200) -> str:
    """What a library's exception says, fit for a one-line message: its first line (cut
    to ``limit`` characters), or its type's name when it says nothing."""
    lines = str(error).strip().splitlines()
    return lines[0][:limit] if lines else type(error).__name__
