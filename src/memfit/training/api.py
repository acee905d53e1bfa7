"""``memfit.train(config)``: the Python entry point the CLI is a thin layer over.

Builds everything first (so bad input fails before anything is written), then creates the
run folder, trains, exports the result and writes ``summary.json``. Distributed, every rank
runs this; only rank 0 writes the run folder's files (the checkpoints are written by all).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memfit import distributed
from memfit._utils.atomic import write_text
from memfit._utils.errors import ConfigError
from memfit._utils.hashing import fingerprint_changes
from memfit._utils.sizes import parse_bytes
from memfit.checkpoint import (
    TrainerState,
    load_checkpoint,
    newest_intact_checkpoint,
    remove_stale_staging,
)
from memfit.checkpoint.export import export_trained
from memfit.checkpoint.folders import checkpoint_folders
from memfit.checkpoint.sharded import gathered_state_dict
from memfit.checkpoint.state import BASE_FILE, CONFIG_FILE, DATA_FILE
from memfit.config import Config, to_yaml
from memfit.config.load import read_yaml
from memfit.config.resume import check_resume_changes
from memfit.config.schema import AdapterKind
from memfit.data.fingerprint import data_fingerprint
from memfit.models.fingerprint import base_fingerprint
from memfit.monitor.memory import (
    CATEGORIES,
    RECORD_HOST_PEAK_KEY,
    RECORD_PEAK_KEY,
    make_memory_meter,
    record_key,
)
from memfit.monitor.metrics import MetricsLogger, read_metrics, strict_json
from memfit.monitor.progress import ProgressBar
from memfit.techniques.adapter_map import original_parameter_count
from memfit.techniques.config_checks import from_mapping
from memfit.training.build import Run, build_run
from memfit.training.fit import auto_fit, refuse_too_large_preset
from memfit.training.loop import train_steps
from memfit.training.run_folder import (
    MARKER_FILE,
    check_new_run_folder,
    create_run_folder,
    is_run_folder,
    open_run_folder,
    refuse_run_inside_data,
)


@dataclass
class RunResult:
    output_dir: Path
    steps: int
    losses: dict[int, float] = field(default_factory=dict)
    eval_losses: dict[int, float] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    # This process's highest measured training step (tensor bytes) in this call; the
    # summary (rank 0's) covers the whole run. None when no step was measured.
    peak_bytes: int | None = None
    # The host bytes this process's offload held at most in that step (the CPU tracker's
    # host pool); None on CUDA or when no step was measured.
    host_peak_bytes: int | None = None


def _as_config(config: Config | dict | str | Path) -> Config:
    if isinstance(config, Config):
        return config
    if isinstance(config, (str, Path)):
        return from_mapping(read_yaml(config))
    return from_mapping(config)


def train(config: Config | dict | str | Path, resume: str | Path | None = None) -> RunResult:
    """Train from a Config, a mapping shaped like the YAML file, or a YAML path.

    ``resume``: a run folder; training continues from its newest checkpoint.
    With distributed.strategy=ddp or fsdp this joins (or creates) the process group first.
    """
    config = _as_config(config)
    config = replace(config, distributed=distributed.setup(config.distributed))
    try:
        return _train(config, resume)
    finally:
        distributed.teardown()


class _SilentLogger:
    """The metrics sink of ranks other than 0: rank 0 logs the reduced values."""

    def log(self, record: dict[str, Any]) -> None:
        pass

    def add_text(self, tag: str, text: str, step: int) -> None:
        pass

    def close(self) -> None:
        pass


def _train(config: Config, resume: str | Path | None) -> RunResult:
    main = distributed.is_main()
    refuse_too_large_preset(config)
    if resume is not None:
        _check_resume_config(config, Path(resume))
    elif main:
        check_new_run_folder(config.train.output_dir)  # before anything is built
        refuse_run_inside_data(config.train.output_dir, {"data.path": config.data.path,
                                                          "data.eval_path": config.data.eval_path})
    choice = None
    if config.memory.auto and resume is None:  # a resumed run keeps what was chosen
        config, choice = auto_fit(config)
        # One write: under --nproc every rank prints it, and print's separate newline
        # lets another rank's line land in between.
        sys.stderr.write(f"memfit: memory.auto chose {choice['strategy']}: "
                         f"{choice['reason']}\n")
        sys.stderr.flush()
    folder = run = None
    try:
        if resume is not None:
            folder = open_run_folder(resume) if main else None
            checkpoint = distributed.broadcast_from_main(
                _checkpoint_to_resume(Path(resume)) if main else None)
        run = build_run(config)
        if resume is None:
            folder = create_run_folder(config.train.output_dir) if main else None
            run_dir = distributed.broadcast_from_main(folder.path if main else None)
            state, resumed_from = TrainerState(), None
            if main:
                header = (f"# memory.auto chose {choice['strategy']}: {choice['reason']}\n"
                          if choice else "")
                write_text(run_dir / CONFIG_FILE, header + to_yaml(run.config))
                write_text(run_dir / DATA_FILE, json.dumps(data_fingerprint(
                    [config.data.path, config.data.eval_path]), indent=2))
                write_text(run_dir / BASE_FILE, json.dumps(base_fingerprint(config.model),
                                                           indent=2))
                _write_adapter_map(run, run_dir)
        else:
            run_dir = Path(resume)
            state, resumed_from = _resume_state(run, checkpoint)
            if state.step > run.total_steps:
                key = ("train.max_steps" if run.config.train.max_steps is not None
                       else "train.epochs")
                raise ConfigError(f"--resume {resume}: its newest checkpoint is at step "
                                  f"{state.step}, past the {run.total_steps} steps {key} "
                                  f"now makes; set {key} to reach at least step {state.step}")
            if state.step >= run.total_steps and (run_dir / "summary.json").is_file():
                return _already_finished(run_dir, state)
            if main:
                _record_resumed_config(run_dir, run.config)
        return _train_in(run, run_dir, state, resumed_from, choice)
    finally:
        if folder is not None:
            folder.close()
        if run is not None and run.replicas is not None:
            run.replicas.close()  # before train() destroys the process group


def _write_adapter_map(run: Run, run_dir: Path) -> None:
    """Which modules got adapters and what trains: ``adapters.txt`` (as printed) and
    ``adapters.json``."""
    if run.adapter_map is not None:
        write_text(run_dir / "adapters.txt", run.adapter_map.to_text() + "\n")
        write_text(run_dir / "adapters.json", json.dumps(run.adapter_map.to_json(), indent=2))


def _check_resume_config(config: Config, run_dir: Path) -> None:
    """Refuse, before anything is written, a resume that would change what is trained:
    compared with the configuration the newest checkpoint was trained with (so an edit of
    the run's config.yaml counts as a change too), or with config.yaml before any."""
    if not is_run_folder(run_dir):
        run = run_dir.parent.parent  # a checkpoint folder given for its run?
        hint = (f"; did you mean --resume {run}?" if run_dir.parent.name == "checkpoints"
                and is_run_folder(run) else "")
        raise ConfigError(f"--resume {run_dir}: not a memfit run folder (no {MARKER_FILE} "
                          f"there){hint}")
    newest = checkpoint_folders(run_dir)[-1:]
    recorded = newest[0] if newest and (newest[0] / CONFIG_FILE).is_file() else run_dir
    saved = from_mapping(read_yaml(recorded / CONFIG_FILE))
    base = _recorded(recorded, BASE_FILE)
    if base is not None:
        _check_same_base(base, saved, config, run_dir)
        if config.model.path != saved.model.path:  # an unchanged copy, named explicitly
            saved = replace(saved, model=replace(saved.model, path=config.model.path))
    check_resume_changes(saved, config, str(run_dir))
    data = _recorded(recorded, DATA_FILE)
    if data is not None:
        changes = fingerprint_changes(data, data_fingerprint([config.data.path,
                                                              config.data.eval_path]))
        if changes:
            raise ConfigError(f"--resume {run_dir}: the data changed since the run started: "
                              f"{_listed(changes)}; resuming would train on other examples: "
                              "restore the data or start a new run")


def _recorded(folder: Path, name: str) -> dict[str, Any] | None:
    """A fingerprint record (data.json, base.json) of ``folder``; None when the run has
    none (runs from before it was recorded); a damaged one is refused in one line."""
    path = folder / name
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        record = None
    if not (isinstance(record, dict) and all(
            isinstance(entry, dict) and set(entry) == {"bytes", "sha256"}
            for entry in record.values())):
        raise ConfigError(f"--resume: {path} is damaged (not memfit's record of file sizes "
                          "and SHA-256); the run cannot prove what it was trained on")
    return record


def _check_same_base(recorded: dict[str, Any], saved: Config, config: Config,
                     run_dir: Path) -> None:
    """Refuse a resume whose base model files differ from those the run started on. A
    ``model.path`` override may name another folder only if its files are the same."""
    path = config.model.path
    if path and not Path(path).exists():
        raise ConfigError(f"--resume {run_dir}: the base model model.path={path} no longer "
                          "exists; name an unchanged copy with model.path=FOLDER")
    changes = fingerprint_changes(recorded, base_fingerprint(config.model))
    if changes:
        moved = (f" (the run started on model.path={saved.model.path})"
                 if path != saved.model.path else "")
        raise ConfigError(f"--resume {run_dir}: the base model changed since the run "
                          f"started: {_listed(changes)}{moved}; resuming would train on "
                          "other weights: restore the base, name an unchanged copy with "
                          "model.path=FOLDER, or start a new run")


def _listed(changes: list[str]) -> str:
    return ", ".join(changes[:3]) + (", ..." if len(changes) > 3 else "")


def _checkpoint_to_resume(run_dir: Path) -> Path | None:
    remove_stale_staging(run_dir)
    checkpoint = newest_intact_checkpoint(run_dir)
    if checkpoint is None:
        print(f"memfit: {run_dir} has no checkpoint yet; starting it from step 0",
              file=sys.stderr)
    return checkpoint


def _resume_state(run: Run, checkpoint: Path | None) -> tuple[TrainerState, int]:
    """The state to continue from, and the step whose records the run folder keeps (-1:
    none, the run starts again)."""
    if checkpoint is None:
        return TrainerState(), -1
    state = load_checkpoint(checkpoint, run.model, run.optimizer, run.scheduler, run.scaler)
    # The optimizer holds the lr of the checkpoint's schedule; train.max_steps may have
    # changed it, so take the current step's lr from the schedule as now configured.
    scheduler = run.scheduler  # a LambdaLR (training/schedule.py)
    for group, base_lr, factor in zip(run.optimizer.param_groups, scheduler.base_lrs,
                                      scheduler.lr_lambdas, strict=True):
        group["lr"] = base_lr * factor(scheduler.last_epoch)
    return state, state.step


def _already_finished(run_dir: Path, state: TrainerState) -> RunResult:
    if distributed.is_main():
        print(f"memfit: {run_dir} already finished at step {state.step}; raise "
              "train.max_steps to train further", file=sys.stderr)
    summary = json.loads((run_dir / "summary.json").read_text())
    return RunResult(run_dir, state.step, summary=summary)


def _record_resumed_config(run_dir: Path, config: Config) -> None:
    """Rewrite config.yaml only when an accepted override changed it, keeping its header."""
    path = run_dir / "config.yaml"
    text = path.read_text(encoding="utf-8")
    if from_mapping(read_yaml(path)) == config:
        return
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    write_text(path, header + to_yaml(config))


def _train_in(run: Run, run_dir: Path, state: TrainerState, resumed_from: int | None,
              choice: dict[str, Any] | None) -> RunResult:
    config, main = run.config, distributed.is_main()
    budget = parse_bytes(config.memory.budget) if config.memory.budget else None
    meter = make_memory_meter(run.device, budget, every_n_steps=config.log.memory_every)
    meter.attach(run.model, run.optimizer)
    logger = MetricsLogger(run_dir, config.log.tensorboard, resume_from_step=resumed_from) \
        if main else _SilentLogger()
    bar = ProgressBar(run.total_steps, state.step, enabled=config.log.progress and main)
    try:
        result = train_steps(run, run_dir, state, logger, meter, on_step=bar.update)
    finally:
        bar.close()
        logger.close()
    full_state = gathered_state_dict(run.model)  # collective; None when not sharded
    peak_bytes = result.peak.peak_bytes if result.peak is not None else None
    host_peak_bytes = result.peak.host_peak_bytes if result.peak is not None else None
    if not main:
        return RunResult(run_dir, result.state.step, result.losses, result.eval_losses,
                         peak_bytes=peak_bytes, host_peak_bytes=host_peak_bytes)
    records = read_metrics(run_dir)
    measured = [r for r in records if RECORD_PEAK_KEY in r]
    if measured:
        from memfit.monitor.memory_plot import plot_memory  # matplotlib (~0.5 s): rank 0 only

        plot_memory(measured, run_dir / "memory.png")
    has_adapter = config.adapter.kind is not AdapterKind.NONE
    exported = export_trained(run_dir, run.model, run.tokenizer, has_adapter, run.is_transformers,
                              config.model.export_module, state_dict=full_state)
    summary = _summary(run, result, run_dir, exported, records)
    if choice:
        summary["auto_fit"] = choice
    write_text(run_dir / "summary.json", strict_json(summary, indent=2))
    return RunResult(run_dir, result.state.step, result.losses, result.eval_losses, summary,
                     peak_bytes, host_peak_bytes)


def _peak(records: list[dict[str, Any]], result) -> tuple[int, dict[str, int], int] | None:
    """The highest measured training step over the whole run (bytes, split, step): the
    records of every segment, and this segment's own peak (which also saw steps
    ``log.every`` left out)."""
    found = [(r[RECORD_PEAK_KEY], {c: r.get(record_key(c), 0) for c in CATEGORIES}, r["step"])
             for r in records if RECORD_PEAK_KEY in r]
    if result.peak is not None:
        found.append((result.peak.peak_bytes, dict(result.peak.by_category), result.peak_step))
    return max(found, key=lambda item: item[0]) if found else None


def _host_peak(records: list[dict[str, Any]], result) -> int | None:
    """The most bytes the offload techniques held in host memory in any measured step (the
    CPU tracker's host pool); None where it is not measured (CUDA)."""
    found = [r[RECORD_HOST_PEAK_KEY] for r in records if RECORD_HOST_PEAK_KEY in r]
    if result.peak is not None and result.peak.host_peak_bytes is not None:
        found.append(result.peak.host_peak_bytes)
    return max(found, default=None)


def _throughput(item: str, state: TrainerState) -> dict[str, int | float]:
    """The whole run's tokens fed to the model (``tokens``, padding excluded; token data
    only) and loss items (``loss_tokens`` or ``examples``), each with its rate."""
    seconds = max(state.elapsed_seconds, 1e-9)
    counts = {"tokens": state.input_tokens} if state.input_tokens else {}
    counts[item] = state.tokens
    return {**counts, **{f"{name}_per_second": count / seconds for name, count in counts.items()}}


def _summary(run: Run, result, run_dir: Path, exported: Path,
             records: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole run from step 0, over every resumed segment (from metrics.jsonl)."""
    state = result.state
    losses = [r["loss"] for r in records if r.get("loss") is not None]
    evals = {r["step"]: r["eval_loss"] for r in records if r.get("eval_loss") is not None}
    summary = {
        "output_dir": str(run_dir),
        "steps": state.step,
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "eval_loss_before": evals.get(0),
        "eval_loss_after": evals[max(evals)] if evals else None,
        **_throughput(run.objective.item_name, state),
        "train_seconds": state.elapsed_seconds,
        "skipped_steps": sum(1 for r in records if r.get("skipped")),
        "trainable_parameters": sum(p.numel() for p in run.trainable_parameters),
        "total_parameters": original_parameter_count(run.model),
        "device": str(run.device),
        "exported": str(exported),
    }
    last_eval = max((r for r in records if r.get("eval_loss") is not None),
                    key=lambda r: r["step"], default={})
    for key in ("eval_accuracy", "eval_macro_f1"):  # classifiers' evaluations have them
        if key in last_eval:
            summary[key] = last_eval[key]
    peak = _peak(records, result)
    if peak is not None:
        summary["memory_peak_bytes"], summary["memory_peak_by_category"] = peak[:2]
        # Which steps the peak is over: log.memory_every=auto samples them on CPU.
        summary["memory_peak_step"] = peak[2]
        # The records cover every segment's logged steps; this segment's own count also
        # has the measured steps log.every left out of them.
        summary["memory_measured_steps"] = max(
            result.measured_steps, sum(1 for r in records if RECORD_PEAK_KEY in r))
        host = _host_peak(records, result)
        if host is not None:
            summary[RECORD_HOST_PEAK_KEY] = host
    else:
        every = run.config.log.memory_every
        summary["memory_peak_bytes"] = None
        summary["memory_not_measured"] = (f"no training step was measured (log.memory_every="
                                          f"{every}); set log.memory_every=1 to measure each")
    return summary
