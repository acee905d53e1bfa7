"""The bench's stacked peak memory per case (its loss curves and peak memory over steps are
monitor.memory_plot.line_plot's). Same colours, units and atomic writes as the run
folder's memory.png (monitor.memory_plot)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from memfit.bench.table import Row
from memfit.monitor.memory import CATEGORIES

# Shared with memory.png so a category has one colour in every memfit picture.
from memfit.monitor.memory_plot import CATEGORY_COLORS, byte_unit, save_png


def memory_bars(rows: Sequence[Row], path: Path) -> Path:
    """One horizontal bar per case, stacked by category at the case's peak."""
    rows = [row for row in rows if row.peak_bytes]
    unit, size = byte_unit(max([row.peak_bytes for row in rows] + [1]))
    figure = Figure(figsize=(9, 0.45 * len(rows) + 1.6))
    axes = figure.add_subplot()
    positions = list(range(len(rows)))
    left = [0.0] * len(rows)
    for category in CATEGORIES:
        widths = [row.by_category.get(category, 0) / size for row in rows]
        axes.barh(positions, widths, left=left, color=CATEGORY_COLORS[category], label=category)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for position, row in zip(positions, rows, strict=True):
        if row.plan_bytes:  # the planner's estimate as a tick on the bar
            axes.plot([row.plan_bytes / size] * 2, [position - 0.4, position + 0.4],
                      color="black", linewidth=1.5)
    axes.set_yticks(positions, labels=[row.name for row in rows], fontsize="small")
    axes.invert_yaxis()
    axes.set_xlabel(f"peak memory ({unit}); black tick: memfit plan's estimate")
    axes.set_title("Peak memory by category")
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    return save_png(figure, path)
