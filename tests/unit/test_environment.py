"""`memfit env` reports a package that fails to import beside this torch (a torchvision
built for another torch raises at import) in one line with the pinned reinstall, not a
traceback; every command names the same library the same way when its import fails deep
inside another one (transformers importing torchvision). The packages here are real: module
files and their dist-info on sys.path, imported for real (in a child process where memfit
imports them alone)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

from memfit._utils.broken_imports import ImportFailure, broken_line, diagnose, import_each
from memfit.environment import package_status

PINNED = torch.__version__.split("+", 1)[0]
# What importing a torchvision compiled against another torch raises, last line last.
BROKEN = ('raise RuntimeError("while registering fakevision::nms\\n'
          'operator fakevision::nms does not exist")\n')


def install(folder: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str,
            version: str | None) -> None:
    """Module ``name`` (a package when ``name`` has a dot: its last part is the submodule)
    with ``source``, and a dist-info saying it is installed unless ``version`` is None."""
    top, _, submodule = name.partition(".")
    if submodule:
        (folder / top).mkdir(exist_ok=True)
        (folder / top / "__init__.py").write_text("")
        (folder / top / f"{submodule}.py").write_text(source)
    else:
        (folder / f"{top}.py").write_text(source)
    if version is not None:
        metadata = folder / f"{top}-{version}.dist-info"
        metadata.mkdir()
        (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {top}\n"
                                           f"Version: {version}\n")
    monkeypatch.syspath_prepend(str(folder))
    for module in [module for module in sys.modules if module.split(".")[0] == top]:
        monkeypatch.delitem(sys.modules, module)


@pytest.fixture(autouse=True)
def forget_fakes(tmp_path):
    """Modules imported from this test's folder leave sys.modules with it."""
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def line(package: str, version: str, last: str) -> str:
    return (f"{package} {version} does not import beside torch {torch.__version__} ({last}); "
            f"reinstall it with: pip install {package} torch=={PINNED}")


def test_a_package_that_fails_to_import_is_one_line_with_the_pinned_reinstall(
        tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, "fakevision", BROKEN, "0.30.0")
    assert package_status("fakevision") == line(
        "fakevision", "0.30.0", "RuntimeError: operator fakevision::nms does not exist")


def test_an_importable_package_shows_its_version(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, "fakehelper", "VALUE = 1\n", "2.0")
    assert package_status("fakehelper") == "2.0"
    assert package_status("fakehelper-not-here") == "not installed"


def test_a_package_broken_by_another_names_the_other(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, "fakevision", BROKEN, "0.30.0")
    install(tmp_path, monkeypatch, "fakeapp", "import fakevision\n", "1.0")
    assert package_status("fakeapp") == "1.0, but it does not import: " + line(
        "fakevision", "0.30.0", "RuntimeError: operator fakevision::nms does not exist")


def test_an_import_that_kills_the_interpreter_is_its_answer_and_the_rest_still_run(
        tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, "fakecrash", "import os, signal\n"
            "os.kill(os.getpid(), signal.SIGSEGV)\n", "1.0")
    install(tmp_path, monkeypatch, "fakehelper", "VALUE = 1\n", "2.0")
    assert import_each(["fakecrash", "fakehelper"]) == {
        "fakecrash": ImportFailure("fakecrash", "fakecrash",
                                   "the interpreter died doing it (SIGSEGV)"),
        "fakehelper": None}


def _raise_like_transformers(module: str) -> BaseException:
    """What ``from transformers import LlamaConfig`` raises when ``module`` (imported
    deep inside it) fails: its own error, with the real one as the cause."""
    try:
        try:
            importlib.import_module(module)
        except Exception as error:
            raise ModuleNotFoundError("Could not import module 'LlamaConfig'. Are this "
                                      "object's requirements defined correctly?") from error
    except ModuleNotFoundError as error:
        return error
    raise AssertionError(f"{module} imported")


def test_an_import_failing_deep_inside_another_library_names_the_broken_one(
        tmp_path, monkeypatch):
    """As the real torchvision: its module-level code calls into another installed library
    (torch.library there, fakecore here) that raises; the library to reinstall is the one
    whose import ran the call (fakevision), not the one that raised (fakecore) nor the one
    that imported it (transformers)."""
    install(tmp_path, monkeypatch, "fakecore.library", "def register(name):\n"
            "    raise RuntimeError(f'operator {name} does not exist')\n", "2.0")
    install(tmp_path, monkeypatch, "fakevision._meta_registrations",
            "from fakecore.library import register\nregister('fakevision::nms')\n", "0.30.0")
    error = _raise_like_transformers("fakevision._meta_registrations")
    assert diagnose(error) == line("fakevision", "0.30.0",
                                   "RuntimeError: operator fakevision::nms does not exist")


def test_failures_that_are_not_an_installed_library_failing_to_import_are_left_alone(
        tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, "own_factory_module", BROKEN, None)  # the user's own
    assert diagnose(_raise_like_transformers("own_factory_module")) is None
    assert diagnose(ValueError("a bug")) is None


def test_a_broken_torch_is_reinstalled_by_itself():
    failure = ImportFailure("torch", "torch", "OSError: libtorch_cpu.so: cannot open")
    assert broken_line(failure).endswith(
        f"reinstall it with: pip install --force-reinstall torch=={PINNED}")
