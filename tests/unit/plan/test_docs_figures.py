"""The planner's accuracy figures quoted in README.md and docs/planner.md are those of the
recorded output of benchmarks/plan_accuracy.py (the table in docs/planner.md), so a new
run pasted there, or a quote edited by hand, cannot leave the other figures stale."""

from __future__ import annotations

import importlib.util
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PLANNER_DOC = ROOT / "docs" / "planner.md"
# One case of the table: architecture, strategy, planned and measured bytes, the error.
ROW = re.compile(r"^(\S+) +(\S+) +([\d,]+) +([\d,]+) +([+-]\d+\.\d)%$", re.MULTILINE)


def _benchmark():
    spec = importlib.util.spec_from_file_location(
        "plan_accuracy", ROOT / "benchmarks" / "plan_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recorded() -> tuple[list[tuple[str, float]], str]:
    """(architecture, planned / measured - 1) of each recorded case, and the summary line."""
    text = PLANNER_DOC.read_text()
    table = text[text.index("\narchitecture "):]
    table = table[:table.index("```")]
    cases = []
    for architecture, _, planned, measured, printed in ROW.findall(table):
        error = int(planned.replace(",", "")) / int(measured.replace(",", "")) - 1
        assert f"{error:+.1%}" == f"{printed}%", (architecture, planned, measured)
        cases.append((architecture, error))
    return cases, table.strip().splitlines()[-1]


def test_the_summary_line_is_the_recorded_tables():
    cases, line = _recorded()
    assert len(cases) > 20
    assert line == _benchmark().summary([abs(error) for _, error in cases])


def test_readme_and_docs_quote_the_recorded_figures():
    cases, _ = _recorded()
    errors = [abs(error) for _, error in cases]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (f"within {statistics.median(errors):.1%} median, {max(errors):.1%} worst over "
            f"{len(errors)} cases") in readme
