"""``memfit report RUN_DIR``: one self-contained HTML page for a run.

The page holds the plan next to the measured memory (``memfit.plan`` on the run's
config.yaml, for the device the run used), the memory timeline, the loss and eval
curves, the answers to data.sample_prompts, the resolved config and the summary.
Images are embedded as base64 PNG data URIs and the style is inline, so the file opens
in any browser without a server or a network. It is written atomically (temporary
name, then rename), never through a link.

A run folder is data people pass around: the report reads only what memfit wrote there
(a folder is a run only with its ``memfit-run.json``), renders values of the wrong type
marked instead of failing, and never imports code the run's config names: the plan is
left out for such a run (``memfit plan`` on its config.yaml is the user's explicit choice).
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from memfit._utils.atomic import write_text
from memfit._utils.errors import ConfigError, MemfitError
from memfit._utils.folders import creation_problem, enclosing_checkpoint
from memfit._utils.no_follow import FILE, check_entry, check_layout, open_no_follow
from memfit._utils.sizes import format_bytes
from memfit.config.code_trust import code_references
from memfit.monitor.memory import CATEGORIES, RECORD_PEAK_KEY
from memfit.monitor.memory_plot import plot_memory
from memfit.monitor.metrics import read_metrics
from memfit.training.run_folder import MARKER_FILE, is_run_folder
from memfit.training.sample_answers import SAMPLE_ANSWERS_KEY

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
    if not is_run_folder(run_dir):
        run = run_dir.parent.parent  # a checkpoint folder given for its run?
        hint = (f"; for a checkpoint, report its run: memfit report {run}"
                if run_dir.parent.name == "checkpoints" and is_run_folder(run) else "")
        raise ConfigError(f"RUN_DIR {run_dir}: not a memfit run folder (no {MARKER_FILE} "
                          f"there){hint}")
    # What the report reads: real files (a FIFO would block the read forever).
    check_layout(run_dir, {"config.yaml": FILE, "summary.json": FILE, "metrics.jsonl": FILE})
    out = Path(out) if out is not None else run_dir / "report.html"
    _check_out(out)
    write_text(out, render_report(run_dir))
    return out


def _check_out(out: Path) -> None:
    """``out`` must be new or a report memfit wrote: never a link, a folder, a FIFO, a
    user's file, or a file inside a checkpoint (whose manifest it would break)."""
    key = f"memfit report --out {out}"
    try:
        exists = check_entry(out, FILE)
    except ConfigError as error:
        raise ConfigError(f"{key}: {error}") from None
    if exists:
        with os.fdopen(open_no_follow(out, os.O_RDONLY), "rb") as handle:
            head = handle.read(512).decode("utf-8", "replace")
        if _GENERATOR not in head:
            raise ConfigError(f"{key}: that exists and is not a memfit report; choose a new "
                              "file name")
    checkpoint = enclosing_checkpoint(out.parent)
    if checkpoint is not None:
        raise ConfigError(f"{key}: {checkpoint} is a checkpoint folder, which holds only what "
                          "its manifest.json lists; write the report elsewhere")
    problem = None if out.parent.is_dir() else creation_problem(out.parent)
    if problem is not None:
        raise ConfigError(f"{key} cannot be written: {problem}")


def render_report(run_dir: Path) -> str:
    summary = _read_json(run_dir / "summary.json")
    logged = read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
    records = _usable(logged)
    config_text = (run_dir / "config.yaml").read_text(errors="replace")
    device = str(summary.get("device", "cpu")) if summary else "cpu"
    sections = [
        f"<h1>memfit run {html.escape(run_dir.resolve().name)}</h1>",
        "<h2>Summary</h2>", _summary_table(summary),
        "<h2>Memory: plan and measured</h2>", _plan_section(run_dir, summary, device),
        "<h2>Memory over the steps</h2>", _memory_timeline(records),
        "<h2>Loss</h2>", _loss_curves(records),
        *_sample_answers(logged),
        "<h2>Resolved configuration (config.yaml)</h2>",
        f"<pre>{html.escape(config_text)}</pre>",
    ]
    body = "\n".join(sections)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">{_GENERATOR}"
            f"<title>memfit run {html.escape(run_dir.resolve().name)}</title>"
            f"<style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _usable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with an integer step, each with only its numeric values: a hand-edited
    metrics.jsonl ("loss": "x") leaves gaps in the curves, never a traceback."""
    return [{key: value for key, value in record.items() if _is_number(value)}
            for record in records
            if isinstance(record.get("step"), int) and not isinstance(record["step"], bool)]


def _bytes_text(value: Any) -> str:
    """A byte count as memfit shows it; anything else marked, as found."""
    if _is_number(value) and value >= 0:
        return format_bytes(value)
    return f"{json.dumps(value)[:40]} (not a byte count)"


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


# Summary keys whose meaning is not in their name: which tokens each rate counts.
_MEANINGS = {
    "tokens": "tokens fed to the model: prompts too, padding not",
    "tokens_per_second": "tokens fed to the model per second (what other tools report)",
    "loss_tokens": "tokens the loss averages over (responses, shifted by one)",
    "loss_tokens_per_second": "loss tokens per second",
}


def _summary_table(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return _note("no summary.json: the run has not finished (or was killed); the "
                     "curves below show what it logged")
    rows = []
    for key, value in summary.items():
        in_bytes = key.startswith("memory_") and key.endswith(("_bytes", "_by_category"))
        if isinstance(value, dict):
            value = ", ".join(f"{k} {_bytes_text(v) if in_bytes else v}"
                              for k, v in value.items())
        elif in_bytes and value is not None:
            value = _bytes_text(value)
        elif isinstance(value, float):
            value = f"{value:.4g}"
        rows.append([key, str(value), _MEANINGS.get(key, "")])
    return _table(["key", "value", "meaning"], rows)


def _plan_section(run_dir: Path, summary: dict[str, Any] | None, device: str) -> str:
    from memfit.plan.planner import load_plan_config, plan
    from memfit.plan.report import format_plan
    from memfit.training.fit import example_batch

    plan_device = "cuda" if device.startswith("cuda") else "cpu"
    try:
        config = load_plan_config(run_dir / "config.yaml", [])
        references = code_references(config)
        if references:
            # Planning builds the model: it would import the factory named in a run folder.
            key, reference = references[0]
            return _note(f"no plan: the run's config.yaml names code to import ({key}="
                         f"{reference}), which memfit report never runs; to see it, run "
                         f"memfit plan {run_dir / 'config.yaml'} --device {plan_device} "
                         "--budget SIZE")
        # A factory or image model is traced on a batch of its data, as `memfit plan` does.
        planned = plan(config, config.memory.budget or _NO_BUDGET, device=plan_device,
                       example_batch=example_batch(config))
    except MemfitError as error:  # e.g. data.path moved since the run
        return _note(f"no plan: {error}")
    estimate = planned.config
    summary = summary or {}
    measured = summary.get("memory_peak_by_category")
    measured = measured if isinstance(measured, dict) else {}
    rows = []
    for category in CATEGORIES:
        rows.append([category, format_bytes(estimate.bytes[category]),
                     _bytes_text(measured[category]) if category in measured else "-"])
    peak = summary.get("memory_peak_bytes")
    usable = _is_number(peak) and peak > 0
    error = f"{(estimate.peak_tensor_bytes - peak) / peak:+.1%}" if usable else "-"
    rows.append(["peak (tensors)", format_bytes(estimate.peak_tensor_bytes),
                 "-" if peak is None else _bytes_text(peak)])
    host = summary.get("memory_host_peak_bytes")  # the CPU tracker's host pool
    if estimate.host_bytes or host:
        rows.append(["host (offloaded)", format_bytes(estimate.host_bytes),
                     _bytes_text(host) if _is_number(host) else "-"])
    overhead = (f" With the CUDA context and allocator slack the plan is "
                f"{format_bytes(estimate.device_bytes)}." if plan_device == "cuda" else "")
    parts = [_table(["category", f"plan (device={plan_device})", "measured"], rows),
             _note(f"plan error (plan - measured) / measured: {error}. Measured: the step "
                   "with the highest peak (CPU: exact live tensor bytes; CUDA: allocator "
                   f"peak, activations = the rest).{overhead}"),
             _note(f"The plan peaks at the {estimate.peak_moment.name}: "
                   f"{estimate.peak_moment.why}.")]
    if config.memory.budget:
        parts.append(f"<details><summary>every strategy against memory.budget="
                     f"{html.escape(str(config.memory.budget))}</summary>"
                     f"<pre>{html.escape(format_plan(planned, config))}</pre></details>")
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
    from memfit.monitor.memory_plot import line_plot
    from memfit.monitor.metrics import losses_by_step

    series = {"training loss": losses_by_step(records),
              "eval loss": losses_by_step(records, "eval_loss")}
    series = {label: values for label, values in series.items() if values}
    if not series:
        return _note("no loss was logged")
    return _image(_rendered(lambda path: line_plot(series, path, "Loss", "loss")),
                  "training and eval loss over the steps")


def _sample_answers(logged: list[dict[str, Any]]) -> list[str]:
    """The heading and a table of data.sample_prompts' answers, a row per evaluation and a
    column per prompt (nothing for a run without sample prompts)."""
    found = [(record["step"], record[SAMPLE_ANSWERS_KEY]) for record in logged
             if isinstance(record.get(SAMPLE_ANSWERS_KEY), list)]
    if not found:
        return []
    prompts: list[str] = []
    for _, answers in found:
        for item in answers:
            prompt = str(item.get("prompt")) if isinstance(item, dict) else "(not an answer)"
            if prompt not in prompts:
                prompts.append(prompt)
    rows = []
    for step, answers in found:
        by_prompt = {str(item.get("prompt")): str(item.get("answer"))
                     for item in answers if isinstance(item, dict)}
        rows.append([str(step), *(by_prompt.get(prompt, "-") for prompt in prompts)])
    return ["<h2>Sample answers</h2>",
            _note("data.sample_prompts answered greedily at each evaluation (metrics.jsonl, "
                  "sample_answers)"),
            _table(["step", *prompts], rows)]
