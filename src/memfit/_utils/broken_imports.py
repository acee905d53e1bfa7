"""Which installed library is broken, when an import fails: one line naming it, the last
line of what it raised, and the reinstall that fixes it with this torch pinned.

An unpinned ``pip install torchvision`` can bring a build compiled against another torch,
whose import raises ``RuntimeError: operator torchvision::nms does not exist``. Nobody
imports torchvision by name here: transformers does, when it is installed, from inside
``from transformers import LlamaConfig``, and reports its own "Could not import module
'LlamaConfig'" with the real error in its cause chain. The library to name is the one whose
module-level code the error went through last (torchvision's ``_meta_registrations``, not
torch's ``library.py`` below it nor transformers' ``image_utils`` above it), and it is
named only when importing that module alone, in a fresh interpreter, fails too.

Stdlib only: this must work when torch itself is what fails to import.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

from memfit._utils.errors import exception_chain

# A child reports each import as one line with this prefix (a library may print too).
_REPORT = "memfit-import: "
_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ImportFailure:
    """``module`` (what was imported) failed because ``culprit`` (the top-level import name
    of the installed library whose import raised) failed with ``last_line``."""

    module: str
    culprit: str
    last_line: str


def last_line(error: BaseException, limit: int = 200) -> str:
    """The last line Python prints for ``error`` (``RuntimeError: operator ... does not
    exist``), with its type's name in front when the message spans lines."""
    lines = [line.strip() for line in "".join(traceback.format_exception_only(
        type(error), error)).splitlines() if line.strip()]
    name = type(error).__name__
    line = lines[-1] if lines else name
    if len(lines) > 1 and not line.split(":", 1)[0].endswith(name):
        line = f"{name}: {line}"
    return line[:limit]


def distribution(module: str) -> str | None:
    """The installed distribution that provides top-level import name ``module``."""
    try:
        importlib.metadata.version(module)
        return module
    except importlib.metadata.PackageNotFoundError:
        pass
    names = importlib.metadata.packages_distributions().get(module, [])
    return names[0] if names else None


def _third_party(module_name: str) -> bool:
    top = module_name.split(".", 1)[0]
    return (top not in sys.stdlib_module_names and top not in ("memfit", "__main__")
            and distribution(top) is not None)


def failing_import(error: BaseException) -> tuple[str, BaseException] | None:
    """The innermost module (dotted name) of an installed third-party library whose
    top-level code ``error``'s chain went through, and the exception that did: a module's
    top-level code in a traceback means its import raised. None when there is none."""
    for exception in reversed(list(exception_chain(error))):  # innermost exception first
        frames = list(traceback.walk_tb(exception.__traceback__))
        for frame, _ in reversed(frames):  # innermost frame first
            name = frame.f_globals.get("__name__", "")
            if frame.f_code.co_name == "<module>" and isinstance(name, str) and \
                    _third_party(name):
                return name, exception
    return None


def failure_of(module: str, error: BaseException) -> ImportFailure:
    """Why importing ``module`` raised ``error``: the library really at fault, and its line."""
    found = failing_import(error)
    if found is None:
        return ImportFailure(module, module.split(".", 1)[0], last_line(error))
    name, exception = found
    return ImportFailure(module, name.split(".", 1)[0], last_line(exception))


def report(payload: dict) -> None:
    """In a child: one report for ``run_child``'s parent, flushed before the next step."""
    print(_REPORT + json.dumps(payload), flush=True)


def _child_main(modules: Sequence[str]) -> None:
    """In the child: import each module, guarded, reporting each before the next starts."""
    for module in modules:
        report({"start": module})
        try:
            importlib.import_module(module)
        except BaseException as error:  # noqa: BLE001 -- SystemExit too: all are answers
            failure = failure_of(module, error)
            report({"module": module, "culprit": failure.culprit,
                    "last_line": failure.last_line})
        else:
            report({"module": module})


def died(status: int | None) -> str:
    """Why a child gave no answer for the step it had started."""
    if status is None:
        return f"did not finish within {_TIMEOUT_S:.0f} s"
    if status < 0:
        try:
            return f"the interpreter died doing it ({signal.Signals(-status).name})"
        except ValueError:
            return f"the interpreter died doing it (signal {-status})"
    return f"the interpreter exited with status {status} doing it"


def run_child(arguments: Sequence[str]) -> tuple[list[dict], str | None, int | None]:
    """``python -m ARGUMENTS`` in a fresh interpreter that sees this process's
    ``sys.path``: the reports it made (``report``), the step it started and did not report
    on (it died or hung there) or None, and its exit status (None: it hung)."""
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        child = subprocess.run([sys.executable, "-m", *arguments], capture_output=True,
                               text=True, env=environment, timeout=_TIMEOUT_S)
        output, status = child.stdout, child.returncode
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout or ""
        output, status = output.decode() if isinstance(output, bytes) else output, None
    reports, started = [], None
    for line in output.splitlines():
        if line.startswith(_REPORT):
            payload = json.loads(line[len(_REPORT):])
            started = payload.get("start")
            if started is None:
                reports.append(payload)
    return reports, started, status


def import_each(modules: Sequence[str]) -> dict[str, ImportFailure | None]:
    """Import each module in a fresh interpreter (one child for all; each import guarded;
    a child that dies or hangs on one module is replaced for the rest): module -> None when
    it imports, else why not."""
    results: dict[str, ImportFailure | None] = {}
    pending = list(modules)
    while pending:
        reports, started, status = run_child(["memfit._utils.broken_imports", *pending])
        for payload in reports:
            results[payload["module"]] = (
                ImportFailure(payload["module"], payload["culprit"], payload["last_line"])
                if "culprit" in payload else None)
        left = [module for module in pending if module not in results]
        if left:  # it died or hung inside this import (or before the first one)
            stuck = started or left[0]
            results[stuck] = ImportFailure(stuck, stuck.split(".", 1)[0], died(status))
        pending = [module for module in left if module not in results]
    return results


def broken_line(failure: ImportFailure) -> str:
    """The one line that names the broken library, what it raised, and its reinstall."""
    package = distribution(failure.culprit) or failure.culprit
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        version = "(version unknown)"
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    if torch is None or package == "torch":
        reinstall = f"pip install --force-reinstall {package}"
        if torch is not None:
            reinstall += f"=={torch.split('+', 1)[0]}"
        return (f"{package} {version} does not import ({failure.last_line}); reinstall it "
                f"with: {reinstall}")
    # The public version (no +cpu/+cu126): pip keeps the installed build when it matches.
    return (f"{package} {version} does not import beside torch {torch} "
            f"({failure.last_line}); reinstall it with: pip install {package} "
            f"torch=={torch.split('+', 1)[0]}")


def diagnose(error: BaseException) -> str | None:
    """The broken-library line when ``error`` is an installed third-party library failing
    to import (and the same module fails alone, in a fresh interpreter); else None."""
    try:
        found = failing_import(error)
        failure = None if found is None else import_each([found[0]])[found[0]]
        return None if failure is None else broken_line(failure)
    except Exception:  # noqa: BLE001 -- a diagnosis that fails must not hide the error
        return None


if __name__ == "__main__":
    _child_main(sys.argv[1:])
