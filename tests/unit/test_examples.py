"""The examples' scripts use memfit's current API: every name they import from memfit, or
call as ``memfit.X``, exists (they are run by hand, not by the suite, so a moved function
would otherwise break them silently)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import memfit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def missing_names(path: Path) -> list[str]:
    missing = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "memfit":
            module = importlib.import_module(node.module)
            missing += [f"{path.name}:{node.lineno}: {node.module}.{alias.name}"
                        for alias in node.names if not hasattr(module, alias.name)
                        and importlib.util.find_spec(f"{node.module}.{alias.name}") is None]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "memfit" and not hasattr(memfit, node.attr)):
            missing.append(f"{path.name}:{node.lineno}: memfit.{node.attr}")
    return missing


def test_every_memfit_name_the_examples_use_exists():
    scripts = sorted(EXAMPLES.rglob("*.py"))
    assert scripts
    assert [line for path in scripts for line in missing_names(path)] == []


def test_a_moved_name_is_found(tmp_path: Path):
    script = tmp_path / "old.py"
    script.write_text("import memfit\nfrom memfit.config import load_config\nmemfit.fit()\n")
    assert missing_names(script) == ["old.py:2: memfit.config.load_config", "old.py:3: memfit.fit"]
