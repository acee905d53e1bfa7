"""``memfit report RUN_DIR``: one self-contained HTML page for a run.

The page holds the plan next to the measured memory (``memfit.plan`` on the run's
config.yaml, for the device the run used), the memory timeline, the loss and eval
curves, the resolved config and the summary. Images are embedded as base64 PNG data
URIs and the style is inline, so the file opens in any browser without a server or a
network. It is written atomically (temporary name, then rename).
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from pathlib import Path
from typing import Any

from memfit._utils.atomic import write_text
from memfit._utils.errors import ConfigError, MemfitError
from memfit._utils.folders import creation_problem
from memfit._utils.sizes import format_bytes
from memfit.monitor.memory import CATEGORIES, RECORD_PEAK_KEY
from memfit.monitor.memory_plot import plot_memory
from memfit.monitor.metrics import read_metrics

# A run without memory.budget is planned against a budget nothing exceeds: only the
# estimate of the configuration as run is shown, not what would fit.
_NO_BUDGET = "1TiB"
# Marks a page memfit wrote, so --out replaces only its own earlier reports.
_GENERATOR = '<meta name="generator" content="memfit report">'
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
img { max-width: 100%; }
.note { color: #666; }
"""


def write_report(run_dir: Path | str, out: Path | str | None = None) -> Path:
    """Render RUN_DIR's report to ``out`` (default RUN_DIR/report.html); returns the path."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"RUN_DIR {run_dir}: no config.yaml there (not a run folder)")
    out = Path(out) if out is not None else run_dir / "report.html"
    if out.is_dir() or (out.exists() and _GENERATOR not in out.read_text(errors="replace")[:512]):
        raise ConfigError(f"memfit report --out {out}: that exists and is not a memfit report; "
                          "choose a new file name")
    problem = None if out.parent.is_dir() else creation_problem(out.parent)
    if problem is not None:
        raise ConfigError(f"memfit report --out {out} cannot be written: {problem}")
    write_text(out, render_report(run_dir))
    return out


def render_report(run_dir: Path) -> str:
    summary = _read_json(run_dir / "summary.json")
    records = read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
    config_text = (run_dir / "config.yaml").read_text()
    device = str(summary.get("device", "cpu")) if summary else "cpu"
    sections = [
        f"<h1>memfit run {html.escape(run_dir.resolve().name)}</h1>",
        "<h2>Summary</h2>", _summary_table(summary),
        "<h2>Memory: plan and measured</h2>", _plan_section(run_dir, summary, device),
        "<h2>Memory over the steps</h2>", _memory_timeline(records),
        "<h2>Loss</h2>", _loss_curves(records),
        "<h2>Resolved configuration (config.yaml)</h2>",
        f"<pre>{html.escape(config_text)}</pre>",
    ]
    body = "\n".join(sections)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">{_GENERATOR}"
            f"<title>memfit run {html.escape(run_dir.resolve().name)}</title>"
            f"<style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n")


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        found = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON (line {error.lineno}, column "
                          f"{error.colno}: {error.msg})") from None
    if not isinstance(found, dict):
        raise ConfigError(f"{path} must hold a JSON object, not {type(found).__name__}")
    return found


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _note(text: str) -> str:
    return f"<p class=\"note\">{html.escape(text)}</p>"


def _image(png: bytes, alt: str) -> str:
    encoded = base64.b64encode(png).decode("ascii")
    return f"<img alt=\"{html.escape(alt)}\" src=\"data:image/png;base64,{encoded}\">"


def _summary_table(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return _note("no summary.json: the run has not finished (or was killed); the "
                     "curves below show what it logged")
    rows = []
    for key, value in summary.items():
        in_bytes = key.startswith("memory_")  # memory_peak_bytes, memory_peak_by_category
        if isinstance(value, dict):
            value = ", ".join(f"{k} {format_bytes(v) if in_bytes else v}"
                              for k, v in value.items())
        elif in_bytes and isinstance(value, int):
            value = format_bytes(value)
        elif isinstance(value, float):
            value = f"{value:.4g}"
        rows.append([key, str(value)])
    return _table(["key", "value"], rows)


def _plan_section(run_dir: Path, summary: dict[str, Any] | None, device: str) -> str:
    import memfit
    from memfit.plan.planner import load_plan_config
    from memfit.plan.report import format_plan
    from memfit.training.fit import example_batch

    plan_device = "cuda" if device.startswith("cuda") else "cpu"
    try:
        config = load_plan_config(run_dir / "config.yaml", [])
        # A factory or image model is traced on a batch of its data, as `memfit plan` does.
        plan = memfit.plan(config, config.memory.budget or _NO_BUDGET, device=plan_device,
                           example_batch=example_batch(config))
    except MemfitError as error:  # e.g. data.path moved since the run
        return _note(f"no plan: {error}")
    estimate = plan.config
    measured = (summary or {}).get("memory_peak_by_category", {})
    rows = []
    for category in CATEGORIES:
        rows.append([category, format_bytes(estimate.bytes[category]),
                     format_bytes(measured[category]) if category in measured else "-"])
    peak = (summary or {}).get("memory_peak_bytes")
    error = (f"{(estimate.peak_tensor_bytes - peak) / peak:+.1%}" if peak else "-")
    rows.append(["peak (tensors)", format_bytes(estimate.peak_tensor_bytes),
                 format_bytes(peak) if peak else "-"])
    overhead = (f" With the CUDA context and allocator slack the plan is "
                f"{format_bytes(estimate.device_bytes)}." if plan_device == "cuda" else "")
    parts = [_table(["category", f"plan (device={plan_device})", "measured"], rows),
             _note(f"plan error (plan - measured) / measured: {error}. Measured: the step "
                   "with the highest peak (CPU: exact live tensor bytes; CUDA: allocator "
                   f"peak, activations = the rest).{overhead}")]
    if config.memory.budget:
        parts.append(f"<details><summary>every strategy against memory.budget="
                     f"{html.escape(str(config.memory.budget))}</summary>"
                     f"<pre>{html.escape(format_plan(plan, config))}</pre></details>")
    return "\n".join(parts)


def _rendered(draw) -> bytes:
    """PNG bytes of ``draw(path)`` (the plot helpers write files atomically)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "figure.png"
        draw(path)
        return path.read_bytes()


def _memory_timeline(records: list[dict[str, Any]]) -> str:
    if not any(RECORD_PEAK_KEY in r for r in records):
        return _note("no step was measured (log.memory_every larger than the run?)")
    return _image(_rendered(lambda path: plot_memory(records, path)),
                  "memory by category over the steps")


def _loss_curves(records: list[dict[str, Any]]) -> str:
    from memfit.bench.plots import line_plot
    from memfit.monitor.metrics import losses_by_step

    series = {"training loss": losses_by_step(records),
              "eval loss": losses_by_step(records, "eval_loss")}
    series = {label: values for label, values in series.items() if values}
    if not series:
        return _note("no loss was logged")
    return _image(_rendered(lambda path: line_plot(series, path, "Loss", "loss")),
                  "training and eval loss over the steps")
