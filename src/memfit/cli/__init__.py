"""The ``memfit`` command: argument parsing and printing only; the work is in the library.

Expected failures (``MemfitError``) print one line and exit 2; ``--debug`` shows the
traceback instead. memfit's own warnings are one ``memfit: warning:`` line each; other
libraries' warnings and logging below ERROR are shown only with ``--debug``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings

from memfit._utils.broken_imports import diagnose as broken_library
from memfit._utils.errors import (
    MemfitError,
    MemfitWarning,
    Stopped,
    is_disk_full,
)
from memfit._utils.gc_thresholds import collect_less_often
from memfit.cli.commands import _say
from memfit.cli.parser import build_parser

DISK_FULL = ("the disk is full (no space left on device); free some space, or move the run "
             "folder to another disk, then resume it")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """memfit's warnings as users read them: one line, no source location (``--debug``
    keeps it); another library's (transformers' notes, PEFT's deprecations, torch's
    advice to its own callers) is not something a memfit user can act on: dropped."""
    if issubclass(category, MemfitWarning):
        _say(f"memfit: warning: {message}")


@contextlib.contextmanager
def _quiet_libraries():
    """Within, only memfit speaks: other libraries' warnings are dropped and their logging
    below ERROR is off (transformers' "use_cache=True is incompatible with gradient
    checkpointing", ...); their errors still show. Restored on return: main may run
    in-process (tests, notebooks)."""
    disabled = logging.root.manager.disable
    # An in-process caller recording warnings (catch_warnings(record=True), pytest.warns)
    # records memfit's too.
    record = warnings._showwarnmsg_impl  # noqa: SLF001
    recording = getattr(record, "__module__", None) != "warnings"

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        _show_warning(message, category, filename, lineno, file, line)
        if recording and issubclass(category, MemfitWarning):
            record(warnings.WarningMessage(message, category, filename, lineno, file, line))

    with warnings.catch_warnings():  # restores warnings.showwarning too
        warnings.showwarning = show
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(disabled)


def main(argv: list[str] | None = None) -> int:
    collect_less_often()  # before the command imports torch & co.
    parser = build_parser()
    # Positionals after an option (`train --nproc 2 a=1 b=2`, `train cfg.yaml --nproc 2 x=1`)
    # come back unparsed: they continue the command's [CONFIG.yaml] [key=value ...].
    args, rest = parser.parse_known_args(argv)
    if rest and (not isinstance(getattr(args, "arguments", None), list)
                 or any(argument.startswith("-") for argument in rest)):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if rest:
        args.arguments.extend(rest)
    if args.command is None:
        parser.print_help()
        return 2
    # transformers' per-file loading bars would interleave with memfit's own output.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if args.debug:
        return _run(args)
    with _quiet_libraries():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """The command, with expected failures as one line and their exit status."""
    try:
        return args.handler(args)
    except MemfitError as error:
        if isinstance(error, Stopped):  # a requested stop, not a failure
            _say(f"memfit: {error}")
            return error.exit_code
        if args.debug:
            raise
        # One line, whatever a value quoted in the message holds (a newline in a path).
        _say("memfit: error: " + str(error).replace("\r", "\\r").replace("\n", "\\n"))
        return error.exit_code
    except Exception as error:
        if args.debug:
            raise
        # The disk running out, or an installed library that fails to import: one line.
        line = DISK_FULL if is_disk_full(error) else broken_library(error)
        if line is None:
            raise
        _say(f"memfit: error: {line}")
        return 2
    except KeyboardInterrupt:
        _say("memfit: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
