"""``memfit bench CONFIG``: the user's own job (their model, data and settings) trained
under the strategies the planner names, each in its own process with the same batches and
seed, measured beside what the plan predicted for it.

    from memfit.bench.job import run_job_bench
    result = run_job_bench(config, "finetune.yaml", top=3)   # the 3 fastest rows that fit
    print(result.markdown)

Strategies are the rows of ``memfit plan`` for this machine's device (``config``: the
configuration as given): ``strategies="lora,lora+ckpt"`` names them, ``top=N`` takes the
N with the least predicted step time among those that fit ``budget`` (default: the GPU's
memory; on a CPU every row counts as fitting). Each runs ``steps`` optimizer steps at the
configured micro-batch; memory is measured on two of them and time on the others, so
the tracker's cost stays out of the step times. The table, results.json and the plots are
those of ``memfit bench --suite`` (bench.runner), ratios to the first strategy.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memfit._utils.errors import ConfigError
from memfit.bench import defaults
from memfit.bench.cases import Case
from memfit.bench.runner import (
    TIME_COLUMNS,
    BenchResult,
    check_steps,
    claim_out_folder,
    measured_steps,
    memory_meter,
    run_cases,
    slug,
    write_outputs,
)
from memfit.bench.table import markdown_table
from memfit.config import to_mapping
from memfit.config.choices import TOKEN_FORMATS
from memfit.config.ignored import IgnoredKeyWarning
from memfit.config.overrides import Overrides, with_overrides
from memfit.config.schema import (
    Config,
    DataConfig,
    DistributedStrategy,
    ModelConfig,
    TrainConfig,
)
from memfit.plan.planner import Plan, plan
from memfit.techniques.config_checks import from_mapping

# The plan's row for the configuration as given, as --strategies names it.
AS_GIVEN = "config"


def run_job_bench(config: Config, label: str, strategies: str | None = None,
                  top: int | None = None, steps: int | None = None,
                  out: Path | str = "bench-results", budget: str | int | None = None,
                  on_progress: Callable[[str], None] = lambda line: None) -> BenchResult:
    """Bench ``config`` (``label``: how the header names it, e.g. its file) under the
    chosen strategies. Raises ConfigError, before anything is written, for a strategy the
    plan does not have, a bad --top or --steps, or a config of several processes."""
    from memfit.training.fit import example_batch

    started = time.perf_counter()
    steps = check_steps(defaults.STEPS if steps is None else steps)
    if config.distributed.nproc > 1 or config.distributed.strategy is not DistributedStrategy.NONE:
        raise ConfigError("memfit bench CONFIG runs each strategy as one process on one device; "
                          "set distributed.strategy=none and distributed.nproc=1 (memfit plan "
                          "--devices N predicts ddp and fsdp)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    planned = plan(config, budget, device=device.type, example_batch=example_batch(config))
    if planned.calibrated:
        on_progress(planned.calibrated)
    chosen = choose(planned, strategies, top)
    cases = [Case(row.name, row.overrides) for row in chosen]
    out = Path(out)
    # Memory on two steps (the tracker slows the steps it measures), time on the others.
    every = max(2, steps // 2)
    planned_cases = [(case, job_mapping(config, case.overrides, out / "runs" / slug(case.name),
                                        steps, every), row.peak_bytes, row.step_seconds)
                     for case, row in zip(cases, chosen, strict=True)]
    claim_out_folder(out, cases, None)
    # This machine's threads, as its calibration (the predicted times) measured them.
    outcomes = run_cases(planned_cases, out, on_progress, one_thread=False)
    rows = [outcome.row for outcome in outcomes]
    wall = time.perf_counter() - started
    baseline = cases[0].name
    heading = [
        f"# memfit bench {label} --steps {steps}",
        "",
        f"{_model_name(config.model)}; {_batch(config.data, config.train)}; {steps} steps per "
        f"strategy, seed {config.train.seed}; device {device.type}; memory measured on "
        f"{measured_steps(every)}: {memory_meter(device)}; step times planned with the "
        f"{planned.profile.name} profile ({planned.profile.source}). "
        f"Wall time {wall / 60:.1f} min.",
        "",
        markdown_table(rows, baseline, ratio_title="x peak"),
        "",
        f"Ratios (x) are to `{baseline}`. plan = the peak tensor bytes of the strategy's row "
        "in `memfit plan` for this device; plan error = (plan - measured) / measured. "
        + TIME_COLUMNS,
    ]
    markdown = write_outputs(out, heading, outcomes, rows, {
        "config": label, "device": device.type, "steps": steps, "wall_seconds": wall,
        "device_profile": {"name": planned.profile.name, "source": planned.profile.source}})
    return BenchResult(out, markdown, rows, outcomes, wall)


@dataclass(frozen=True)
class PlannedRow:
    """A row of the plan as the bench runs it."""

    name: str  # the plan's row name, or AS_GIVEN
    overrides: Overrides  # what the row changes in the user's config
    peak_bytes: int  # planned peak tensor bytes
    step_seconds: float  # planned seconds per optimizer step
    fits: bool  # within the budget (a row of unknown fit counts as fitting)


def choose(planned: Plan, strategies: str | None, top: int | None) -> list[PlannedRow]:
    """The rows to run: those ``strategies`` names, in its order, or the ``top`` fastest
    that fit (default: defaults.TOP), fastest first."""
    rows = {AS_GIVEN: PlannedRow(AS_GIVEN, {}, planned.config.peak_tensor_bytes,
                                 planned.config_time.seconds, True)}
    rows.update({row.name: PlannedRow(row.name, row.overrides, row.estimate.peak_tensor_bytes,
                                      row.time.seconds, row.fits is not False)
                 for row in planned.strategies})
    if strategies is not None and top is not None:
        raise ConfigError("give --strategies NAMES or --top N, not both")
    if strategies is not None:
        names = list(dict.fromkeys(part.strip() for part in strategies.split(",")))
        for name in names:
            if name in planned.skipped:
                raise ConfigError(f"--strategies: {name!r} cannot be trained here: "
                                  f"{planned.skipped[name]}")
            if name not in rows:
                raise ConfigError(f"--strategies: {name!r} is not a strategy of this plan; "
                                  f"choose from: {', '.join(rows)}")
        return [rows[name] for name in names]
    top = defaults.TOP if top is None else top
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ConfigError(f"--top must be a positive integer, got {top!r}")
    fitting = sorted((row for row in rows.values() if row.fits and row.name != AS_GIVEN),
                     key=lambda row: (row.step_seconds, row.name))
    if not fitting:
        raise ConfigError(f"no strategy fits {planned.budget_bytes} bytes; `memfit plan` says "
                          "which comes closest, or name some with --strategies")
    return fitting[:top]


def job_mapping(config: Config, overrides: Overrides, run_dir: Path, steps: int, every: int
                ) -> dict[str, Any]:
    """The job under one strategy, as a YAML-shaped mapping for its process: ``steps``
    optimizer steps into ``run_dir``, every step logged, memory measured on every
    ``every``-th, no memory.auto (it would swap the strategy) and no TensorBoard or
    progress bar (their time is not the strategy's). Validated here, so a strategy training
    refuses fails in one line before any process starts."""
    mapping = to_mapping(with_overrides(config, {
        **overrides, "train.max_steps": steps, "train.output_dir": str(run_dir),
        "memory.auto": False, "log.every": 1, "log.memory_every": every,
        "log.progress": False, "log.tensorboard": False}))
    with warnings.catch_warnings():
        # A strategy's keys leave some of the user's unused (adapter.* under full-adamw):
        # expected here, not worth a line each.
        warnings.simplefilter("ignore", IgnoredKeyWarning)
        from_mapping(mapping)
    return mapping


def _batch(data: DataConfig, train: TrainConfig) -> str:
    """The data and batch as the header says them."""
    tokens = f" x {data.max_length} tokens" if data.format in TOKEN_FORMATS else ""
    return (f"{data.format.value} data, micro-batch {train.micro_batch_size}{tokens}, "
            f"{train.gradient_accumulation_steps} accumulation steps")


def _model_name(model: ModelConfig) -> str:
    return model.path or model.preset or model.factory
