"""``memfit bench``: run every case in its own process on the same model, data and seed,
then write the side-by-side table and the plots.

    from memfit.bench import run_bench
    result = run_bench("all", out="bench-results")   # what `memfit bench --suite all` does
    print(result.markdown)

Suites differ in how many steps run and how often memory is measured (see ``SUITES``);
every suite fills the whole table. Files under ``out``: ``bench.md`` (the tables),
``results.json`` (every record, the plans, the notes), ``memory.png`` (stacked peak by
category, with the plan's estimate), ``loss.png``, ``memory_over_steps.png``,
``runs/<case>/`` (memfit's run folders: ``memfit report`` works on them) and ``logs/``.

``out`` must be a new or empty folder, or one ``memfit bench`` made before (it carries
``memfit-bench.json``): anything else is refused before any case runs, so a user's own
results.json or runs/ are never replaced. In a bench folder nothing is written through a
link (see memfit._utils.no_follow).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memfit._utils.atomic import write_text
from memfit._utils.errors import ConfigError, MemfitError
from memfit._utils.folders import creation_problem, enclosing_checkpoint
from memfit._utils.no_follow import FILE, FOLDER, check_layout, link_message, remove_entry
from memfit.bench import plots
from memfit.bench.cases import BASELINE, Case, select
from memfit.bench.models import BenchModel, bench_model, materialize
from memfit.bench.process import CaseFailed, run_in_own_process
from memfit.bench.table import Row, markdown_table, pairs_table, summarize
from memfit.config import to_mapping
from memfit.monitor.memory import RECORD_PEAK_KEY
from memfit.monitor.memory_plot import line_plot
from memfit.techniques.config_checks import from_mapping

# suite -> default optimizer steps per case. memory: every step measured; the others
# measure every k-th step (``memory_every``) and time the rest.
SUITES = {"memory": 3, "speed": 20, "quality": 60, "all": 60}
# Written into ``out`` when a bench first uses it: a folder with it is one bench may rewrite.
BENCH_MARKER = "memfit-bench.json"
# What a bench writes in ``out`` (per case: specs/<case>.json, results/<case>.json,
# logs/<case>.log, runs/<case>/; model/<name>/ for a random-init model).
_LAYOUT = {BENCH_MARKER: FILE, "bench.md": FILE, "results.json": FILE, "memory.png": FILE,
           "loss.png": FILE, "memory_over_steps.png": FILE, "specs": FOLDER, "results": FOLDER,
           "logs": FOLDER, "runs": FOLDER, "model": FOLDER}


@dataclass(frozen=True)
class CaseOutcome:
    case: Case
    records: list[dict[str, Any]]
    plan_bytes: int | None
    note: str | None  # skipped or failed: why (records empty)
    predicted_seconds: float | None = None  # the planner's step time for the case

    @property
    def row(self) -> Row:
        if self.note:
            return Row(self.case.name, None, {}, None, None, None, False, None, self.note)
        return summarize(self.case.name, self.records, self.plan_bytes, self.predicted_seconds)


@dataclass(frozen=True)
class BenchResult:
    out: Path
    markdown: str
    rows: list[Row]
    outcomes: list[CaseOutcome]
    wall_seconds: float

    @property
    def failed(self) -> list[str]:
        return [o.case.name for o in self.outcomes if o.note and o.note.startswith("failed")]


def memory_every(suite: str, steps: int) -> int:
    """Measure every step for the memory suite; else about four measured steps."""
    return 1 if suite == "memory" else max(2, steps // 4)


def base_mapping(model: BenchModel, folder: Path, data: Path, steps: int, every: int
                 ) -> dict[str, Any]:
    """What every case shares: constant lr, no clipping, no eval split (the peers' loops
    have neither), one seed; memory measured on steps every, 2*every, ..."""
    return {
        "model": {"path": str(folder)},
        "data": {"path": str(data), "format": model.data_format,
                 "max_length": model.max_length, "eval_fraction": 0.0},
        "precision": model.precision,
        "adapter": {"rank": 8, "alpha": 16.0, "targets": ["all-linear"]},
        "optimizer": {"galore": {"rank": 16, "update_gap": 50, "scale": 0.25}},
        "train": {"micro_batch_size": model.micro_batch_size, "max_steps": steps,
                  "lr_schedule": "constant", "warmup_steps": 0, "max_grad_norm": None,
                  "seed": 0},
        "log": {"tensorboard": False, "progress": False, "every": 1, "memory_every": every},
    }


def case_mapping(base: dict[str, Any], case: Case, run_dir: Path) -> dict[str, Any]:
    """The case's full config as a YAML-shaped mapping (validated here, before any
    process starts, so a bad combination fails in one line)."""
    from memfit.config.overrides import with_overrides

    config = with_overrides(from_mapping(base), case.overrides)
    config = with_overrides(config, {"train.output_dir": str(run_dir)})
    mapping = to_mapping(config)
    from_mapping(mapping)
    return mapping


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def planned(mapping: dict[str, Any], device: torch.device) -> tuple[int | None, float | None]:
    """The planner's peak tensor bytes and step seconds for exactly this configuration
    (``memfit.plan(...).config`` without the other strategies, which the table does not
    need); (None, None) where it cannot be planned."""
    from memfit.plan import estimate
    from memfit.plan.planned_device import planned_device
    from memfit.plan.planner import as_config
    from memfit.plan.step_time import step_time

    try:
        planned_estimate = estimate(as_config(mapping), device.type)
        profile = planned_device(device.type).profile
    except MemfitError:
        return None, None
    return planned_estimate.peak_tensor_bytes, step_time(planned_estimate.work, profile).seconds


def claim_out_folder(out: Path, cases: list[Case], model: str | None) -> None:
    """Make ``out`` this bench's, before any case runs: a new or empty folder, or one a
    bench made before; ConfigError naming what is there otherwise, or when one of the
    entries a bench writes is a link or of the wrong kind. ``model``: the bench model whose
    folder it writes under model/ (None: the user's own job, which writes none)."""
    key = f"memfit bench --out {out}"
    checkpoint = enclosing_checkpoint(out)
    if checkpoint is not None:
        raise ConfigError(f"{key} is inside the checkpoint folder {checkpoint}, which holds "
                          "only what its manifest.json lists; choose another folder")
    if out.is_symlink():
        raise ConfigError(f"{key}: {link_message(out)}")
    if out.exists():
        if not out.is_dir():
            raise ConfigError(f"{key} is a file, not a folder; choose a new or empty folder")
        contents = sorted(path.name for path in out.iterdir())
        if contents and not (out / BENCH_MARKER).is_file():
            shown = ", ".join(contents[:3]) + (", ..." if len(contents) > 3 else "")
            raise ConfigError(f"{key} already exists and is not a memfit bench folder (it holds "
                              f"{shown}, but no {BENCH_MARKER}); choose a new or empty folder")
    else:
        problem = creation_problem(out)
        if problem is not None:
            raise ConfigError(f"{key} cannot be created: {problem}")
    names = [slug(case.name) for case in cases]
    check_layout(out, {**_LAYOUT, **({f"model/{model}": FOLDER} if model else {}),
                       **{f"specs/{name}.json": FILE for name in names},
                       **{f"results/{name}.json": FILE for name in names},
                       **{f"logs/{name}.log": FILE for name in names}})
    write_text(out / BENCH_MARKER, json.dumps({"written_by": "memfit bench"}))


def spawn(case: Case, mapping: dict[str, Any], out: Path, one_thread: bool = True
          ) -> list[dict[str, Any]]:
    """Run one case in a child process and return its records. Raises CaseFailed.
    ``one_thread`` (CPU only): the child computes on one thread (see below); False keeps
    this machine's threads, as the planner's calibration of it does."""
    name = slug(case.name)
    spec, result = out / "specs" / f"{name}.json", out / "results" / f"{name}.json"
    write_text(spec, json.dumps({"case": case.name, "peer": case.peer, "config": mapping},
                                indent=2))
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if one_thread and not torch.cuda.is_available():
        # One thread per case: on a shared or small CPU, intra-op threads waiting on each
        # other make step times swing several-fold; one thread keeps the ratios steady.
        env["OMP_NUM_THREADS"] = "1"
    return run_in_own_process(["-m", "memfit.bench.case", str(spec), str(result)], result,
                              log=out / "logs" / f"{name}.log", env=env)["records"]


def run_bench(suite: str = "all", model: str = "demo-base", out: Path | str = "bench-results",
              steps: int | None = None, cases: str | None = None,
              on_progress: Callable[[str], None] = lambda line: None) -> BenchResult:
    """Run the cases of ``cases`` (see bench.cases.select) for ``suite`` on ``model``.

    Raises ConfigError for an unknown suite, model or case, or a bad step count."""
    started = time.perf_counter()
    if suite not in SUITES:
        raise ConfigError(f"--suite {suite!r} is not one of: {', '.join(SUITES)}")
    steps = check_steps(SUITES[suite] if steps is None else steps)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    settings = bench_model(model, device)
    chosen = select(cases)
    out = Path(out)
    claim_out_folder(out, chosen, model)
    folder, data = materialize(model, out)
    base = base_mapping(settings, folder, data, steps, memory_every(suite, steps))

    planned_cases = []
    for case in chosen:
        mapping = case_mapping(base, case, out / "runs" / slug(case.name))
        planned_cases.append((case, mapping, *planned(mapping, device)))
    outcomes = run_cases(planned_cases, out, on_progress)
    rows = [outcome.row for outcome in outcomes]
    wall = time.perf_counter() - started
    every = memory_every(suite, steps)
    meter = memory_meter(device) + ("" if device.type == "cpu" else
                                    "; activations = peak - weights - grads - optimizer")
    heading = [
        f"# memfit bench --suite {suite} --model {model} --steps {steps}",
        "",
        f"{settings.description}; {settings.data_format} data, micro-batch "
        f"{settings.micro_batch_size} x {settings.max_length} tokens; {steps} steps per case, "
        f"seed 0, constant lr, no clipping; device {device.type}"
        f"{' (one thread per case)' if device.type == 'cpu' else ''}; memory measured on "
        f"{measured_steps(every)}: {meter}. Wall time {wall / 60:.1f} min.",
        "",
        markdown_table(rows, BASELINE),
        "",
        f"Ratios (x) are to `{BASELINE}`. plan = `memfit.plan.estimate(config, "
        f"\"{device.type}\")` peak tensor bytes of the case's memfit configuration "
        "(for a peer: the memfit configuration doing the same job); plan error = (plan - "
        f"measured) / measured. {TIME_COLUMNS}",
    ]
    pairs = [(o.case.mirrors, o.case.name) for o in outcomes if o.case.mirrors]
    pairs_markdown = pairs_table(rows, pairs)
    if pairs_markdown:
        heading += ["", "## memfit against the peer doing the same job", "", pairs_markdown]
    markdown = write_outputs(out, heading, outcomes, rows, {
        "suite": suite, "model": model, "device": device.type, "steps": steps,
        "wall_seconds": wall})
    return BenchResult(out, markdown, rows, outcomes, wall)


# What the time columns of every bench table mean.
TIME_COLUMNS = (
    "step ms: median over steps other than the first and the memory-measured ones (`*`: "
    "every step was measured, so it includes the tracker's cost); plan step ms: the "
    "planner's step time for the case's memfit configuration on this device's profile; "
    "time error = (plan - measured) / measured. final loss: mean training loss of the last "
    "5 steps (same batches for all).")


def memory_meter(device: torch.device) -> str:
    """What measured the peaks, as the header says it."""
    return ("exact live tensor bytes (memfit's CPU tensor tracker)" if device.type == "cpu"
            else "torch.cuda.max_memory_allocated")


def measured_steps(every: int) -> str:
    """Which steps log.memory_every=``every`` measures, in words."""
    return "every step" if every == 1 else f"steps {every}, {2 * every}, ..."


def check_steps(steps: Any) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"--steps must be a positive integer, got {steps!r}")
    return steps


def run_cases(planned_cases: list[tuple[Case, dict[str, Any], int | None, float | None]],
              out: Path, on_progress: Callable[[str], None], one_thread: bool = True
              ) -> list[CaseOutcome]:
    """Run each (case, its config mapping, planned bytes, planned seconds) in its own
    process, in order; a case that fails or cannot run here is a note, not an error."""
    outcomes = []
    for index, (case, mapping, plan_bytes, predicted) in enumerate(planned_cases, start=1):
        where = f"[{index}/{len(planned_cases)}] {case.name}"
        missing = case.missing()
        if missing:
            note = f"skipped: {', '.join(missing)} not installed"
            outcomes.append(CaseOutcome(case, [], None, note))
            on_progress(f"{where}: {note}")
            continue
        # A previous bench's run of this case: memfit.train refuses to overwrite a run. In a
        # bench folder the name is bench's own; a link there is removed itself.
        remove_entry(out / "runs" / slug(case.name))
        case_started = time.perf_counter()
        try:
            records, note = spawn(case, mapping, out, one_thread), None
        except CaseFailed as failure:
            records = []
            note = f"failed: {failure.last_line[:160]} (see logs/{slug(case.name)}.log)"
        outcomes.append(CaseOutcome(case, records, plan_bytes, note, predicted))
        on_progress(f"{where}: {note or 'done'} ({time.perf_counter() - case_started:.0f} s)")
    return outcomes


def write_outputs(out: Path, markdown_parts: list[str], outcomes: list[CaseOutcome],
                  rows: list[Row], about: dict[str, Any]) -> str:
    """bench.md (``markdown_parts``, one per line), results.json (``about``, then every
    case's plan and records) and the PNGs; returns the markdown."""
    markdown = "\n".join(markdown_parts) + "\n"
    write_text(out / "bench.md", markdown)
    write_text(out / "results.json", json.dumps({
        **about,
        "cases": [{"name": o.case.name, "plan_peak_tensor_bytes": o.plan_bytes,
                   "plan_step_seconds": o.predicted_seconds, "note": o.note,
                   "records": o.records} for o in outcomes]}, indent=1))
    measured = [o for o in outcomes if o.records]
    if any(row.peak_bytes for row in rows):
        plots.memory_bars(rows, out / "memory.png")
        line_plot({o.case.name: {r["step"]: r[RECORD_PEAK_KEY] for r in o.records
                                 if RECORD_PEAK_KEY in r} for o in measured},
                  out / "memory_over_steps.png", "Peak memory of each measured step",
                  "peak memory", bytes_axis=True, markers=True)
    if measured:
        line_plot({o.case.name: {r["step"]: r["loss"] for r in o.records}
                   for o in measured}, out / "loss.png", "Training loss", "loss")
    return markdown
