"""A torchvision built for another torch installed beside memfit (issue #34): `memfit env`
still prints every row and names it in one line with the pinned reinstall; `memfit plan`
and `memfit train`, whose `from transformers import LlamaConfig` imports torchvision (as
transformers does whenever torchvision and Pillow are installed), print that same line
and exit 2, with no traceback.

The torchvision here is a real package on PYTHONPATH with its dist-info, whose import fails
as the real one's does: its ``_meta_registrations`` registers a fake kernel for an operator
its (missing) compiled library would have defined, and torch.library raises.

Why these cases take 5-9 s each: every one is a fresh `memfit` interpreter with the broken
package first on its path (what a user's shell is), and `memfit env` imports each library
again in a child of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_line_error, cli_env, regression_config, run_in_process

pytest.importorskip("PIL.Image")  # without Pillow, transformers never imports torchvision

META_REGISTRATIONS = '''import torch


@torch.library.register_fake("torchvision::nms")
def meta_nms(dets, scores, iou_threshold):
    return dets.new_empty(0, dtype=torch.long)
'''
PINNED = torch.__version__.split("+", 1)[0]
LINE = (f"torchvision 0.99.0 does not import beside torch {torch.__version__} (RuntimeError: "
        f"operator torchvision::nms does not exist); reinstall it with: pip install "
        f"torchvision torch=={PINNED}")


def install(folder: Path, package: str, version: str, files: dict[str, str]) -> Path:
    """``package`` (its files by name) and its dist-info in ``folder``."""
    (folder / package).mkdir()
    for name, source in files.items():
        (folder / package / name).write_text(source)
    metadata = folder / f"{package}-{version}.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\n"
                                       f"Version: {version}\n")
    return folder


@pytest.fixture(scope="module")
def broken_torchvision(tmp_path_factory) -> Path:
    return install(tmp_path_factory.mktemp("site"), "torchvision", "0.99.0", {
        "__init__.py": "import torch\n\nfrom torchvision import _meta_registrations  "
                       '# noqa: F401\n\n__version__ = "0.99.0"\n',
        "_meta_registrations.py": META_REGISTRATIONS})


def run_beside(folder: Path, *arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    """``memfit ARGUMENTS`` with ``folder`` first on PYTHONPATH."""
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(folder), env["PYTHONPATH"]])
    return subprocess.run([sys.executable, "-m", "memfit", *arguments], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=300)


def test_env_names_the_broken_library_in_one_line_and_prints_every_row(
        broken_torchvision, tmp_path):
    result = run_beside(broken_torchvision, "env", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    rows = {line[:24].strip(): line[25:] for line in result.stdout.splitlines()}
    assert rows["torchvision"] == LINE
    assert rows["presets"] == "unavailable: torchvision does not import (see its row)"
    assert rows["torch"] == torch.__version__ and rows["distributed gloo"] in ("yes", "no")
    assert "torchvision" in rows["peft"] and LINE not in rows["peft"]  # see its row


def test_a_command_that_imports_it_prints_that_line_and_exits_2(broken_torchvision, tmp_path):
    """Every command's failure goes through the same place (cli._run); plan stands for them
    (train: the factory case below)."""
    result = run_beside(broken_torchvision, "plan", "model.preset=tiny-llama", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, f"memfit: error: {LINE}\n"), result.stderr
    assert list(tmp_path.iterdir()) == []  # no run folder begun


def test_env_prints_every_row_when_transformers_itself_does_not_import(tmp_path):
    """The rows that need it (PEFT, the presets) say so instead; the optimizers, which do
    not, are listed."""
    (tmp_path / "site").mkdir()
    site = install(tmp_path / "site", "transformers", "99.0", {
        "__init__.py": 'raise ImportError("cannot import name \'is_torch_greater\'")\n'})
    result = run_beside(site, "env", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    rows = {line[:24].strip(): line[25:] for line in result.stdout.splitlines()}
    assert rows["transformers"].startswith("transformers 99.0 does not import beside torch ")
    assert "(ImportError: cannot import name 'is_torch_greater'); reinstall it with: pip " \
           f"install transformers torch=={PINNED}" in rows["transformers"]
    assert rows["peft"].endswith("but it does not import: transformers does not (see its row)")
    assert rows["presets"] == "unavailable: transformers does not import (see its row)"
    assert rows["optimizers"].startswith("adamw, ")


def test_train_with_a_factory_that_imports_a_broken_library_names_it(tmp_path, monkeypatch):
    """In this process (transformers imported already), the first import to fail is the
    model.factory's own module, which imports the broken library: the same line, after
    the key."""
    install(tmp_path, "factoryvision", "0.99.0", {
        "__init__.py": 'raise RuntimeError("operator factoryvision::nms does not exist")\n'})
    (tmp_path / "own_model.py").write_text("import factoryvision\n\n\ndef build():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = regression_config(tmp_path, tmp_path / "run")
    result = run_in_process("train", str(config), "model.factory=own_model:build",
                            cwd=tmp_path)
    assert_one_line_error(result, 2, "model.factory='own_model:build': cannot import "
                          "'own_model': " + LINE.replace("torchvision", "factoryvision"))
    assert not (tmp_path / "run").exists()
