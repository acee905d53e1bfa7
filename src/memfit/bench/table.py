"""From each case's records to one row of numbers, and rows to markdown tables.

A case's records are metrics.jsonl lines (``step``, ``loss``, ``tokens``,
``step_seconds``; memory keys on measured steps; a model.factory's count no ``tokens``).
Per case:

- memory: the measured step with the highest ``memory_peak_bytes``, split by category;
- speed: the median ``step_seconds`` and tokens/s over the *timed* steps — every step but
  the first (warm-up, lazily created optimizer state) and the memory-measured ones (on CPU
  the tensor tracker costs time per op); when no step is left, all steps (marked ``*``);
- quality: the final loss, the mean training loss of the last ``FINAL_LOSS_STEPS`` steps
  (every case sees the same batches in the same order, so these are comparable).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from memfit._utils.sizes import format_bytes
from memfit.monitor.memory import CATEGORIES, RECORD_PEAK_KEY, record_key

FINAL_LOSS_STEPS = 5
Record = dict[str, Any]


@dataclass(frozen=True)
class Row:
    name: str
    peak_bytes: int | None
    by_category: dict[str, int]
    plan_bytes: int | None  # the planner's peak_tensor_bytes for the case's memfit config
    step_seconds: float | None
    tokens_per_second: float | None
    timed_with_tracker: bool  # no step was left untracked: times include the tracker
    final_loss: float | None
    note: str | None = None  # skipped or failed: why
    # the planner's step time for the case's memfit config (plan.step_time), seconds
    predicted_seconds: float | None = None


def summarize(name: str, records: Sequence[Record], plan_bytes: int | None,
              predicted_seconds: float | None = None) -> Row:
    measured = [r for r in records if RECORD_PEAK_KEY in r]
    peak = max(measured, key=lambda r: r[RECORD_PEAK_KEY], default=None)
    timed = [r for r in records if r["step"] > 1 and RECORD_PEAK_KEY not in r]
    with_tracker = not timed
    timed = timed or list(records)
    seconds = statistics.median(r["step_seconds"] for r in timed) if timed else None
    # A model.factory's records count no tokens (its batches are arrays, not text).
    counted = timed and all("tokens" in r for r in timed)
    tokens_per_second = (sum(r["tokens"] for r in timed) / sum(r["step_seconds"] for r in timed)
                         if counted else None)
    losses = [r["loss"] for r in sorted(records, key=lambda r: r["step"])
              if not math.isnan(r["loss"])]
    final = statistics.fmean(losses[-FINAL_LOSS_STEPS:]) if losses else None
    return Row(name, peak[RECORD_PEAK_KEY] if peak else None,
               {c: peak.get(record_key(c), 0) for c in CATEGORIES} if peak else {},
               plan_bytes, seconds, tokens_per_second, with_tracker, final, None,
               predicted_seconds)


def _ratio(value: float | None, baseline: float | None) -> str:
    if value is None or not baseline:
        return "-"
    return f"{value / baseline:.2f}"


def _bytes(value: int | None) -> str:
    return format_bytes(value) if value is not None else "-"


def _error(planned: float | None, measured: float | None) -> str:
    """(planned - measured) / measured, signed: below 0, the plan was short."""
    if planned is None or not measured:
        return "-"
    return f"{(planned - measured) / measured:+.1%}"


def _milliseconds(seconds: float | None, star: str = "") -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}{star}"


def _markdown(header: list[str], lines: list[list[str]]) -> str:
    align = ["---"] + ["---:"] * (len(header) - 1)  # names left, numbers right
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, align, *lines])


def markdown_table(rows: Sequence[Row], baseline: str, ratio_title: str = "x AdamW") -> str:
    """The side-by-side table; ratios are to the row named ``baseline`` (``-`` if absent),
    the peak's under ``ratio_title``."""
    base = next((row for row in rows if row.name == baseline and not row.note), None)
    header = ["case", *CATEGORIES, "peak", ratio_title, "plan", "plan error", "step ms",
              "plan step ms", "time error", "x time", "tokens/s", "final loss", "x loss"]
    lines = []
    for row in rows:
        if row.note:
            lines.append([row.name, row.note] + [""] * (len(header) - 2))
            continue
        star = "*" if row.timed_with_tracker else ""
        lines.append([
            row.name, *(_bytes(row.by_category.get(c)) for c in CATEGORIES),
            _bytes(row.peak_bytes), _ratio(row.peak_bytes, base and base.peak_bytes),
            _bytes(row.plan_bytes), _error(row.plan_bytes, row.peak_bytes),
            _milliseconds(row.step_seconds, star), _milliseconds(row.predicted_seconds),
            _error(row.predicted_seconds, row.step_seconds),
            _ratio(row.step_seconds, base and base.step_seconds),
            f"{row.tokens_per_second:,.0f}" if row.tokens_per_second else "-",
            f"{row.final_loss:.4f}" if row.final_loss is not None else "-",
            _ratio(row.final_loss, base and base.final_loss)])
    return _markdown(header, lines)


def pairs_table(rows: Sequence[Row], pairs: Sequence[tuple[str, str]]) -> str:
    """memfit against the peer doing the same job: ``pairs`` are (memfit case, peer case);
    ratios below 1 mean memfit uses less memory, steps faster, or ends at a lower loss."""
    by_name = {row.name: row for row in rows if not row.note}
    header = ["memfit case", "peer", "peak memfit / peer", "step time memfit / peer",
              "tokens/s memfit / peer", "final loss memfit / peer"]
    lines = []
    for ours, theirs in pairs:
        if ours not in by_name or theirs not in by_name:
            continue
        a, b = by_name[ours], by_name[theirs]
        lines.append([ours, theirs, _ratio(a.peak_bytes, b.peak_bytes),
                      _ratio(a.step_seconds, b.step_seconds),
                      _ratio(a.tokens_per_second, b.tokens_per_second),
                      _ratio(a.final_loss, b.final_loss)])
    return _markdown(header, lines) if lines else ""


def text_table(columns: Sequence[tuple[str, int]], rows: Iterable[Sequence[str]]) -> str:
    """A fixed-width plain-text table (the benchmarks/ scripts' output): ``columns`` are
    (title, width); the first is left-aligned, the others right; a dashed rule under the
    header."""
    (first, first_width), rest = columns[0], columns[1:]

    def line(cells: Sequence[str]) -> str:
        return f"{cells[0]:<{first_width}}" + "".join(
            f"{cell:>{width}}" for cell, (_, width) in zip(cells[1:], rest, strict=True))

    header = line([first, *(title for title, _ in rest)])
    return "\n".join([header, "-" * len(header), *(line(row) for row in rows)])
