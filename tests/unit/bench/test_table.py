"""Rows from records, and the markdown tables."""

from __future__ import annotations

import pytest

from memfit.bench.table import Row, markdown_table, pairs_table, summarize, text_table


def _records(losses: list[float], measured: set[int], peak: int = 1000,
             seconds: float = 0.5) -> list[dict]:
    records = []
    for step, loss in enumerate(losses, start=1):
        record = {"step": step, "loss": loss, "tokens": 100, "step_seconds": seconds}
        if step in measured:
            record.update({"memory_peak_bytes": peak + step, "memory_weights_bytes": 10,
                           "memory_grads_bytes": 0, "memory_optimizer_bytes": 20,
                           "memory_activations_bytes": peak + step - 30,
                           "memory_temporaries_bytes": 0})
        records.append(record)
    return records


def test_summarize_takes_the_highest_measured_step_and_times_the_others():
    records = _records([5.0, 4.0, 3.0, 2.0, 1.0, 1.0, 1.0, 1.0], measured={2, 4})
    records[0]["step_seconds"] = 9.0  # the first step warms up: not timed
    records[1]["step_seconds"] = 7.0  # measured: not timed
    row = summarize("case", records, plan_bytes=1100)
    assert row.peak_bytes == 1004
    assert row.by_category["activations"] == 974
    assert sum(row.by_category.values()) == row.peak_bytes
    assert row.step_seconds == 0.5 and row.tokens_per_second == pytest.approx(200)
    assert not row.timed_with_tracker
    assert row.final_loss == pytest.approx(1.2)  # the last five steps: 2, 1, 1, 1, 1


def test_all_steps_measured_are_timed_with_the_tracker():
    row = summarize("case", _records([2.0, 1.0], measured={1, 2}), None)
    assert row.timed_with_tracker and row.step_seconds == 0.5
    assert row.final_loss == pytest.approx(1.5)


def test_markdown_table_ratios_plan_error_and_notes():
    base = summarize("base", _records([2.0] * 3, {3}, peak=1000), plan_bytes=1003)
    half = summarize("half", _records([1.0] * 3, {3}, peak=500, seconds=1.0), 1006,
                     predicted_seconds=0.8)
    skipped = Row("missing", None, {}, None, None, None, False, None, "skipped: x not installed")
    table = markdown_table([base, half, skipped], baseline="base").splitlines()
    assert table[0].startswith("| case | weights | grads | optimizer | activations |")
    cells = [cell.strip() for cell in table[3].split("|")[1:-1]]
    assert cells[0] == "half"
    assert cells[7] == "0.50"  # peak 503 / 1003
    assert cells[9] == "+100.0%"  # plan 1006 vs measured 503
    assert cells[10:13] == ["1000.0", "800.0", "-20.0%"]  # step ms: measured, planned
    assert cells[13] == "2.00"  # step time
    assert cells[16] == "0.50"  # final loss
    assert "skipped: x not installed" in table[4]


def test_pairs_table_compares_memfit_with_its_peer():
    ours = summarize("memfit LoRA", _records([1.0] * 3, {3}, peak=500), None)
    theirs = summarize("PEFT LoRA", _records([1.0] * 3, {3}, peak=1000), None)
    table = pairs_table([ours, theirs], [("memfit LoRA", "PEFT LoRA"), ("absent", "PEFT LoRA")])
    lines = table.splitlines()
    assert len(lines) == 3
    assert "| memfit LoRA | PEFT LoRA | 0.50 | 1.00 | 1.00 | 1.00 |" == lines[2]


def test_text_table_aligns_names_left_and_numbers_right():
    table = text_table([("case", 8), ("peak", 6), ("x", 5)], [["a", "1.0", "0.50"],
                                                             ["longer", "12.5", "1.00"]])
    assert table.splitlines() == ["case      peak    x",
                                  "-------------------",
                                  "a          1.0 0.50",
                                  "longer    12.5 1.00"]
