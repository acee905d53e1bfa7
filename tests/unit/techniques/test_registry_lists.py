"""Every list of optimizer and technique names a user reads comes from the registries or is
checked against them: docs/optimizers.md's table and README.md's technique table are
generated, `memfit env` lists the optimizers, and each optimizer the README and the docs
name as ``optimizer.name=X`` is registered."""

from __future__ import annotations

import re
from pathlib import Path

from memfit.environment import describe_here
from memfit.techniques.docs_table import technique_table
from memfit.techniques.optimizers import SPECS
from memfit.techniques.optimizers.docs_table import optimizer_table
from memfit.techniques.registry import TECHNIQUES

ROOT = Path(__file__).resolve().parents[3]
END = "<!-- end of generated table -->"
# optimizer.name=adamw8bit, `optimizer.name: lion`, "optimizer.name": "sgd"
NAMED = re.compile(r"""optimizer\.name["`]?\s*[=:]\s*["`]?([A-Za-z0-9_\-]+)(?![\w.:/])""")


def generated_part(path: Path, module: str) -> str:
    """What ``path`` holds between the marker naming ``python -m module`` and the end marker."""
    text = path.read_text()
    start = text.index(f"python -m {module} -->\n") + len(f"python -m {module} -->\n")
    return text[start:text.index(END, start)]


def test_docs_optimizer_table_is_generated_from_the_registry() -> None:
    table = generated_part(ROOT / "docs" / "optimizers.md",
                           "memfit.techniques.optimizers.docs_table")
    assert table == optimizer_table(), (
        "docs/optimizers.md is stale: paste `python -m memfit.techniques.optimizers.docs_table`"
        " between its markers")
    assert all(f"| `{name}` |" in table for name in SPECS)


def test_readme_technique_table_is_generated_from_the_registry() -> None:
    table = generated_part(ROOT / "README.md", "memfit.techniques.docs_table")
    assert table == technique_table(), (
        "README.md's technique table is stale: paste `python -m memfit.techniques.docs_table` "
        "between its markers")
    assert all(spec.docs_row in table for spec in TECHNIQUES)


def test_memfit_env_lists_every_registered_optimizer() -> None:
    rows = dict(describe_here())
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
