"""PNG plots of measured memory: per-step breakdown over a run, and the peak as bars; and
lines over optimizer steps (the bench's peaks and losses, ``memfit report``'s loss curves).

Both read what ``StepMemory.to_record()`` writes (``memory_peak_bytes``,
``memory_<category>_bytes``, optional ``memory_budget_bytes``); records without
``memory_peak_bytes`` (evaluation lines, unmeasured steps) are skipped. Figures are drawn
on an Agg canvas without pyplot (no global backend or figure state) and written
atomically (``memfit._utils.atomic.replace_file``): never through a link, with the mode a
plain ``open()`` gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from memfit._utils.atomic import replace_file
from memfit.monitor.memory import (
    CATEGORIES,
    RECORD_BUDGET_KEY,
    RECORD_PEAK_KEY,
    record_key,
)

Series = Mapping[str, Mapping[int, float]]  # label -> step -> value

# One colour per category, the same in every memfit plot.
CATEGORY_COLORS = {
    "weights": "#4c72b0",
    "grads": "#dd8452",
    "optimizer": "#55a868",
    "activations": "#c44e52",
    "temporaries": "#8172b3",
}


def byte_unit(largest: float) -> tuple[str, int]:
    # Binary units, as everywhere in memfit; pick the one that keeps ticks readable.
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest >= size:
            return name, size
    return "B", 1


def save_png(figure: Figure, path: Path) -> Path:
    path = Path(path)
    FigureCanvasAgg(figure)
    replace_file(path, lambda stream: figure.savefig(stream, format="png", dpi=100))
    return path


def plot_memory(records: Sequence[Mapping[str, object]], path: Path | str) -> Path:
    """Stacked areas of each category at each step's peak, plus the peak (and budget) line.

    ``records`` are dicts with ``step`` and the ``to_record()`` keys, e.g. the lines of
    ``metrics.jsonl``. Raises ValueError if none has memory keys.
    """
    rows = [r for r in records if RECORD_PEAK_KEY in r and "step" in r]
    if not rows:
        raise ValueError(f"no record has both 'step' and {RECORD_PEAK_KEY!r}; nothing to plot")
    # A resumed run may repeat a step: the later record wins, as in read_metrics users.
    by_step = {int(r["step"]): r for r in rows}
    steps = sorted(by_step)
    peaks = [int(by_step[s][RECORD_PEAK_KEY]) for s in steps]
    budgets = [by_step[s].get(RECORD_BUDGET_KEY) for s in steps]
    largest = max(peaks + [int(b) for b in budgets if b is not None])
    unit, size = byte_unit(largest)

    figure = Figure(figsize=(8, 4.5))
    axes = figure.add_subplot()
    layers = [[int(by_step[s].get(record_key(c), 0)) / size for s in steps] for c in CATEGORIES]
    if len(steps) == 1:
        # stackplot needs two x values to draw an area; show one step as stacked bars.
        bottom = 0.0
        for name, layer in zip(CATEGORIES, layers, strict=True):
            axes.bar(steps, layer, bottom=bottom, color=CATEGORY_COLORS[name], label=name,
                     width=0.6)
            bottom += layer[0]
    else:
        axes.stackplot(steps, layers, labels=CATEGORIES,
                       colors=[CATEGORY_COLORS[c] for c in CATEGORIES])
    axes.plot(steps, [p / size for p in peaks], color="black", linewidth=1.5, label="peak")
    if any(b is not None for b in budgets):
        axes.plot(
            steps,
            [int(b) / size if b is not None else float("nan") for b in budgets],
            color="black",
            linestyle="--",
            linewidth=1,
            label="budget",
        )
    axes.set_xlabel("optimizer step")
    axes.set_ylabel(f"memory at the step's peak ({unit})")
    axes.set_ylim(bottom=0)
    axes.set_title("Memory per step by category")
    axes.legend(loc="upper left", fontsize="small", ncol=2)
    # Fixed margins (room for tick labels of up to 6 characters: values stay below 1024
    # of the unit) instead of tight_layout, which draws the figure once more: every run
    # writes this plot, and that halved its ~0.3 s.
    figure.subplots_adjust(left=0.09, right=0.98, top=0.93, bottom=0.11)
    return save_png(figure, Path(path))


def plot_peak_breakdown(
    by_category: Mapping[str, int], path: Path | str, title: str = "Peak memory by category"
) -> Path:
    """Horizontal bars, one per category, of ``StepMemory.by_category`` (e.g. ``meter.peak``)."""
    unknown = sorted(set(by_category) - set(CATEGORIES))
    if unknown:
        raise ValueError(f"unknown memory categories {unknown}; valid: {', '.join(CATEGORIES)}")
    sizes = [int(by_category.get(c, 0)) for c in CATEGORIES]
    unit, size = byte_unit(max(sizes + [1]))

    figure = Figure(figsize=(7, 3.5))
    axes = figure.add_subplot()
    positions = range(len(CATEGORIES))
    axes.barh(positions, [s / size for s in sizes], color=[CATEGORY_COLORS[c] for c in CATEGORIES])
    axes.set_yticks(list(positions), labels=list(CATEGORIES))
    axes.invert_yaxis()  # weights at the top, in the vocabulary's order
    for position, value in zip(positions, sizes, strict=True):
        axes.annotate(
            f" {value / size:.2f} {unit}",
            (value / size, position),
            va="center",
            fontsize="small",
        )
    axes.set_xlabel(unit)
    axes.set_title(f"{title} (total {sum(sizes) / size:.2f} {unit})")
    axes.margins(x=0.2)
    figure.tight_layout()
    return save_png(figure, Path(path))


def line_plot(series: Series, path: Path, title: str, ylabel: str, bytes_axis: bool = False,
              markers: bool = False) -> Path:
    """One line per label over optimizer steps; ``bytes_axis`` scales to binary units."""
    largest = max((v for values in series.values() for v in values.values()), default=1)
    unit, size = byte_unit(largest) if bytes_axis else ("", 1)
    figure = Figure(figsize=(9, 5))
    axes = figure.add_subplot()
    for label, values in series.items():
        steps = sorted(values)
        axes.plot(steps, [values[s] / size for s in steps], label=label, linewidth=1.2,
                  marker="o" if markers or len(steps) == 1 else None, markersize=3)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel(f"{ylabel} ({unit})" if unit else ylabel)
    axes.set_title(title)
    if bytes_axis:
        axes.set_ylim(bottom=0)
    axes.legend(fontsize="x-small", ncol=2)
    figure.tight_layout()
    return save_png(figure, path)
