"""Every list of optimizer names a user reads comes from the registry or is checked
against it: docs/optimizers.md's table is generated, `memfit env` lists the registry, and
each optimizer the README and the docs name as ``optimizer.name=X`` is registered."""

from __future__ import annotations

import re
from pathlib import Path

from memfit.environment import describe
from memfit.techniques.optimizers import SPECS
from memfit.techniques.optimizers.docs_table import optimizer_table

ROOT = Path(__file__).resolve().parents[3]
START = "<!-- generated from the registry: python -m memfit.techniques.optimizers.docs_table -->\n"
END = "<!-- end of generated table -->"
# optimizer.name=adamw8bit, `optimizer.name: lion`, "optimizer.name": "sgd"
NAMED = re.compile(r"""optimizer\.name["`]?\s*[=:]\s*["`]?([A-Za-z0-9_\-]+)(?![\w.:/])""")


def test_docs_optimizer_table_is_generated_from_the_registry() -> None:
    text = (ROOT / "docs" / "optimizers.md").read_text()
    table = text[text.index(START) + len(START):text.index(END)]
    assert table == optimizer_table(), (
        "docs/optimizers.md is stale: paste `python -m memfit.techniques.optimizers.docs_table`"
        " between its markers")
    assert all(f"| `{name}` |" in table for name in SPECS)


def test_memfit_env_lists_every_registered_optimizer() -> None:
    rows = dict(describe())
    assert rows["optimizers"].startswith(", ".join(SPECS) + ", ")


def test_every_optimizer_the_docs_name_is_registered() -> None:
    unknown = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            unknown += [f"{path.name}:{number}: {name}" for name in NAMED.findall(line)
                        if name not in SPECS]
    assert not unknown, unknown


def test_the_name_pattern_finds_names_and_skips_class_paths() -> None:
    assert NAMED.findall("`optimizer.name=adamw8bit` or optimizer.name: lion") == [
        "adamw8bit", "lion"]
    assert NAMED.findall("optimizer.name=package.module:Class, optimizer.name=x.py:C") == []
