"""Memory plots: valid PNGs, written atomically, from records a real meter produced."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from matplotlib.image import imread
from torch import nn

from memfit.monitor.memory import make_memory_meter
from memfit.monitor.memory_plot import plot_memory, plot_peak_breakdown

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def measured_records(steps: int, budget_bytes: int | None = None) -> list[dict[str, object]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    meter = make_memory_meter("cpu", budget_bytes)
    meter.attach(model, optimizer)
    records: list[dict[str, object]] = [{"step": 0, "eval_loss": 1.0}]  # skipped: no memory
    for step in range(1, steps + 1):
        with meter.step():
            model(torch.randn(4 * step, 8)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        assert meter.last_step is not None
        records.append({"step": step, "loss": 0.5, **meter.last_step.to_record()})
    return records


def assert_png(path: Path, folder: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width, channels = imread(path).shape
    assert height > 100 and width > 100 and channels in (3, 4)
    assert [p.name for p in folder.iterdir()] == [path.name]  # no temporary left behind


@pytest.mark.parametrize("steps", [1, 4])
def test_plot_memory_writes_a_png(tmp_path: Path, steps: int) -> None:
    records = measured_records(steps, budget_bytes=10**6)
    path = plot_memory(records, tmp_path / "memory.png")
    assert path == tmp_path / "memory.png"
    assert_png(path, tmp_path)


def test_plot_memory_replaces_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "memory.png"
    target.write_bytes(b"old")
    plot_memory(measured_records(2), target)
    assert_png(target, tmp_path)


def test_plot_memory_without_memory_records_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="memory_peak_bytes"):
        plot_memory([{"step": 1, "loss": 1.0}], tmp_path / "memory.png")
    assert list(tmp_path.iterdir()) == []


def test_plot_peak_breakdown_writes_a_png(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    meter = make_memory_meter("cpu")
    meter.attach(model)
    with meter.step():
        model(torch.randn(4, 8)).sum().backward()
    assert meter.peak is not None
    path = plot_peak_breakdown(meter.peak.by_category, tmp_path / "peak.png")
    assert_png(path, tmp_path)
    with pytest.raises(ValueError, match="valid: weights"):
        plot_peak_breakdown({"kv_cache": 1}, tmp_path / "bad.png")
