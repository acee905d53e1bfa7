"""The targets of #35 over plan_time.py's rows (no torch: tests/unit/plan/test_docs_figures.py
checks the recorded table's summary with it)."""

from __future__ import annotations

import itertools
import statistics


def report(rows: list[tuple[str, str, float, float]]) -> list[str]:
    """The targets' lines (plan_time.py's docstring) for (arch, method, predicted, measured)
    rows."""
    errors = [abs(p / m - 1) for _, _, p, m in rows]
    lines = [f"median |error| {statistics.median(errors):.1%} (target <= 15%), worst "
             f"{max(errors):.1%} (target <= 35%), {len(rows)} cases"]
    by_case = {(a, m): (p, t) for a, m, p, t in rows}
    ratio_errors = []
    for (arch, method), (predicted, measured) in by_case.items():
        plain = method.split("+")[0]
        if plain != method and (arch, plain) in by_case:
            plain_predicted, plain_measured = by_case[(arch, plain)]
            ratio_errors.append(((predicted / plain_predicted) / (measured / plain_measured) - 1,
                                 f"{arch} {method}"))
    if ratio_errors:
        worst = max(ratio_errors, key=lambda item: abs(item[0]))
        lines.append(f"level ratios: worst {worst[0]:+.1%} ({worst[1]}) of {len(ratio_errors)} "
                     "(target within 15%)")
    pairs = [(a, b) for a, b in itertools.combinations(rows, 2)
             if max(a[3], b[3]) / min(a[3], b[3]) > 1.25]
    wrong = [(a, b) for a, b in pairs if (a[2] < b[2]) != (a[3] < b[3])]
    lines.append(f"ordering: {len(pairs) - len(wrong)} of {len(pairs)} pairs measured >25% "
                 "apart ordered correctly" + "".join(
                     f"; wrong: {a[0]} {a[1]} vs {b[0]} {b[1]}" for a, b in wrong[:5]))
    return lines
