"""The bench's PNGs are written and decode."""

from __future__ import annotations

from pathlib import Path

from matplotlib.image import imread

from memfit.bench.plots import memory_bars
from memfit.bench.table import Row
from memfit.monitor.memory_plot import line_plot


def test_memory_bars_and_line_plot_write_pngs(tmp_path: Path):
    rows = [Row("a", 3 * 2**20, {"weights": 2**20, "activations": 2 * 2**20}, 2**21,
                0.1, 10.0, False, 1.0),
            Row("skipped", None, {}, None, None, None, False, None, "skipped")]
    bars = memory_bars(rows, tmp_path / "memory.png")
    lines = line_plot({"a": {1: 2.0, 2: 1.5}, "b": {2: 1.0}}, tmp_path / "loss.png",
                      "Training loss", "loss")
    for path in (bars, lines):
        image = imread(path)
        assert image.ndim == 3 and image.shape[0] > 100
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically
