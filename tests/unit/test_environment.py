"""`memfit env` reports a package that fails to import beside this torch (a torchvision
built for another torch raises at import) in one line with the pinned reinstall, not a
traceback. The packages here are real: a module file and its dist-info on sys.path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memfit.environment import package_status

# What importing a torchvision compiled against another torch raises, first line first.
BROKEN = 'raise RuntimeError("operator fakevision::nms does not exist\\nmore context")\n'


def install(folder: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str,
            version: str) -> None:
    (folder / f"{name}.py").write_text(source)
    metadata = folder / f"{name}-{version}.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\n"
                                       f"Version: {version}\n")
    monkeypatch.syspath_prepend(str(folder))


def test_a_package_that_fails_to_import_is_one_line_with_the_pinned_reinstall(
        tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, "fakevision", BROKEN, "0.30.0")
    pinned = torch.__version__.split("+", 1)[0]
    assert package_status("fakevision") == (
        f"0.30.0 (broken with torch {torch.__version__}: RuntimeError: operator "
        f"fakevision::nms does not exist; reinstall with pip install fakevision "
        f"torch=={pinned})")


def test_an_importable_package_shows_its_version(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, "fakehelper", "VALUE = 1\n", "2.0")
    assert package_status("fakehelper") == "2.0"
    assert package_status("fakehelper-not-here") == "not installed"

