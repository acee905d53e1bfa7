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


def _step_time_table() -> tuple[list[tuple[str, str, float, float]], list[str]]:
    """(arch, method, predicted, measured) of each row of the recorded benchmarks/plan_time.py
    output in docs/planner.md ("Step times"), and its summary lines."""
    text = PLANNER_DOC.read_text()
    section = text[text.index("\n## Step times"):]
    block = section[section.index("\narchitecture method"):]
    lines = block[:block.index("```")].strip().splitlines()[1:]
    row = re.compile(r"^(\S+) +(\S+) +([\d.]+)ms +([\d.]+)ms +([+-]\d+\.\d)%$")
    rows = []
    for line in lines:
        found = row.match(line)
        if found:
            arch, method, predicted, measured, printed = found.groups()
            rows.append((arch, method, float(predicted), float(measured)))
    return rows, [line for line in lines if line and not row.match(line)]


def test_the_step_time_summary_is_the_recorded_tables():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from plan_time_report import report

    rows, summary = _step_time_table()
    assert len(rows) >= 30  # #35: at least 30 cases
    # The README quotes the recorded summary.
    median, worst, cases = re.search(r"median \|error\| ([\d.]+)%.*worst ([\d.]+)%.*?(\d+) cases",
                                     summary[0]).groups()
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (f"within {median}% median, {worst}% worst of measured ones over {cases} cases"
            in readme)
    # The printed lines, recomputed from the rows (the ms figures are rounded to 0.1 ms,
    # so the recomputed percentages may differ in the last digit: compare the figures).
    numbers = re.compile(r"[+-]?\d+\.?\d*")
    for recomputed, recorded in zip(report(rows), summary, strict=True):
        for a, b in zip(numbers.findall(recomputed), numbers.findall(recorded), strict=True):
            assert abs(float(a) - float(b)) <= 0.2, (recomputed, recorded)


def test_the_device_list_is_the_builtin_profiles():
    from memfit.plan.devices import datasheet_rows

    text = PLANNER_DOC.read_text()
    for name, figures, source in datasheet_rows():
        assert f"| `{name}` | {figures} | {source} |" in text
