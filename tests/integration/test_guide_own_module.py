"""docs/guide.md, "Bring your own module", run as a reader would: in an empty folder, each
block in order, a file block (first line ``# NAME``) written to NAME and each line of a
bash block run. So the guide and what memfit does cannot drift apart."""

from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import run_in_process

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"
SECTION = "## 4. Bring your own module"
FENCED_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def section_blocks() -> list[tuple[str, str]]:
    """(language, body) of every fenced block of the section, in order."""
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start)
    return FENCED_BLOCK.findall(text[start:end if end != -1 else len(text)])


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
    assert program == "python", f"the guide runs {program!r}; teach this test to run it"
    with python_in(folder) as output:
        if arguments[0] == "-c":
            exec(compile(arguments[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            runpy.run_path(arguments[0], run_name="__main__")
    return output.getvalue()


@pytest.fixture(autouse=True)
def no_loading_bars():
    """What the CLI does for a fresh process (HF_HUB_DISABLE_PROGRESS_BARS, read when
    transformers is imported), done here, where transformers may have been imported."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    yield
    logging.enable_progress_bar()


def test_bring_your_own_module_runs_as_the_guide_shows(tmp_path: Path):
    printed = []
    for language, body in section_blocks():
        if language == "bash":
            printed += [run_line(line, tmp_path) for line in body.splitlines() if line.strip()]
            continue
        header = body.splitlines()[0]
        assert language in ("python", "yaml") and header.startswith("# "), (language, header)
        (tmp_path / header.removeprefix("# ")).write_text(body)

    assert (tmp_path / "runs/net/adapter/buffers.safetensors").is_file()
    assert re.search(r"mean squared error \d", "".join(printed))
    assert "the merged folder and base + adapter predict the same" in printed[-1]
