"""`memfit report` on a real short run: one self-contained HTML page whose images are
embedded PNGs that decode, with no reference to anything outside the file."""

from __future__ import annotations

import base64
import html
import io
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from cli_helpers import run_in_process, tiny_run_arguments
from matplotlib.image import imread

from memfit._utils.errors import ConfigError
from memfit.plan import estimate
from memfit.plan.planner import load_plan_config
from memfit.report import write_report
from memfit.training.fit import example_batch

PNG_PREFIX = "data:image/png;base64,"


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.references: list[str] = []  # every src/href
        self.headings: list[str] = []
        self._in_heading = False

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "img":
            self.images.append(attributes["src"])
        self.references += [value for key, value in attrs if key in ("src", "href")]
        self._in_heading = tag in ("h1", "h2")

    def handle_data(self, data):
        if self._in_heading:
            self.headings.append(data)
            self._in_heading = False


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    from cli_helpers import write_instructions

    folder = tmp_path_factory.mktemp("report")
    data = write_instructions(folder / "rows.jsonl")
    run = folder / "run"
    result = run_in_process("train", *tiny_run_arguments(
        data, run, "train.max_steps=3", "train.eval_every=2", "train.micro_batch_size=2",
        "data.eval_fraction=0.2", "log.tensorboard=false",
        "memory.activation_offload=true"), cwd=folder)  # host bytes to report
    assert result.returncode == 0, result.stderr
    return run


def test_report_is_one_self_contained_page(run_dir: Path, tmp_path: Path):
    out = tmp_path / "page" / "report.html"
    result = run_in_process("report", str(run_dir), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    page = _Page()
    page.feed(text)
    assert page.headings[1:] == ["Summary", "Memory: plan and measured", "Memory over the steps",
                                 "Loss", "Resolved configuration (config.yaml)"]
    assert len(page.images) == 2  # the memory timeline, the loss and eval curves
    for source in page.images:
        assert source.startswith(PNG_PREFIX)
        image = imread(io.BytesIO(base64.b64decode(source[len(PNG_PREFIX):])), format="png")
        assert image.ndim == 3 and image.shape[1] > 100
    assert page.references == page.images  # nothing but the embedded images
    assert "http://" not in text and "https://" not in text
    assert "plan (device=cpu)" in text and "optimizer:" in text  # plan table, config
    assert "host (offloaded)" in text  # the plan's host bytes beside the tracker's host pool
    # ... and the moment of the step that sets the plan's peak, as memfit plan names it.
    config = load_plan_config(run_dir / "config.yaml", [])
    planned = estimate(config, "cpu", example_batch(config))
    assert html.escape(f"The plan peaks at the {planned.peak_moment.name}: "
                       f"{planned.peak_moment.why}.") in text
    assert not list(out.parent.glob(".*.tmp"))  # written atomically


def test_report_defaults_into_the_run_folder_and_refuses_other_folders(run_dir: Path,
                                                                        tmp_path: Path):
    # In-process: the CLI path is covered above; this checks the default and the refusal.
    assert write_report(run_dir) == run_dir / "report.html"
    assert (run_dir / "report.html").read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(ConfigError, match=r"^RUN_DIR .*: no config.yaml there \(not a run "):
        write_report(tmp_path)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless Chromium not installed")
def test_report_renders_in_headless_chromium(run_dir: Path, tmp_path: Path):
    out = tmp_path / "report.html"
    result = run_in_process("report", str(run_dir), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--dump-dom",
                          out.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0 and "Memory: plan and measured" in dom.stdout
