"""Running a section of docs/guide.md as a reader would: in an empty folder, each fenced
block in order. A file block is written to its name — the block's info string after the
language (```` ```jsonl train.jsonl ````), or for languages with comments a first line
``# NAME`` — and each line of a bash block runs (``memfit`` in process, ``python``)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cli_helpers import no_loading_bars, run_in_process

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"
FENCED_BLOCK = re.compile(r"^```(\w+)[ \t]*(\S*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    language: str
    name: str  # the file a file block is written to; "" for bash
    body: str


def section_blocks(heading: str) -> list[Block]:
    """Every fenced block of the section that starts with ``heading``, in order."""
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index(heading)
    end = text.find("\n## ", start)
    blocks = []
    for language, name, body in FENCED_BLOCK.findall(text[start:end if end != -1 else None]):
        first = body.splitlines()[0]
        if language != "bash" and not name:
            assert first.startswith("# "), f"a {language} block of {heading!r} names no file"
            name = first.removeprefix("# ")
        blocks.append(Block(language, name, body))
    return blocks


def run_section(heading: str, folder: Path) -> list[str]:
    """Write the section's files into ``folder`` and run its commands there; returns what
    each command printed."""
    printed = []
    with no_loading_bars():
        for block in section_blocks(heading):
            if block.language == "bash":
                printed += [run_line(line, folder) for line in block.body.splitlines()
                            if line.strip()]
            else:
                (folder / block.name).write_text(block.body)
    return printed


@contextlib.contextmanager
def python_in(folder: Path) -> Iterator[io.StringIO]:
    """Run Python as ``python`` started in ``folder`` would (its modules importable), then
    forget the modules imported from there, so tests stay independent."""
    previous, output = Path.cwd(), io.StringIO()
    os.chdir(folder)
    sys.path.insert(0, str(folder))
    try:
        with contextlib.redirect_stdout(output):
            yield output
    finally:
        sys.path.remove(str(folder))
        os.chdir(previous)
        for name, module in list(sys.modules.items()):
            if Path(getattr(module, "__file__", None) or "/").parent == folder:
                del sys.modules[name]


def run_line(line: str, folder: Path) -> str:
    """One command of a bash block; returns what it printed."""
    program, *arguments = shlex.split(line)
    if program == "memfit":
        result = run_in_process(*arguments, cwd=folder)
        assert result.returncode == 0, (line, result.stderr)
        return result.stdout
    assert program == "python", f"the guide runs {program!r}; teach guide_helpers to run it"
    with python_in(folder) as output:
        if arguments[0] == "-c":
            exec(compile(arguments[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            runpy.run_path(arguments[0], run_name="__main__")
    return output.getvalue()
