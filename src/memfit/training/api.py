"""``memfit.train(config)``: the Python entry point the CLI is a thin layer over.

Builds everything first (so bad input fails before anything is written), then creates the
run folder, trains, exports the result and writes ``summary.json``. Distributed, every rank
runs this; only rank 0 writes the run folder's files (the checkpoints are written by all).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit import distributed
from memfit._utils.atomic import write_text
from memfit._utils.errors import ConfigError
from memfit._utils.sizes import parse_bytes
from memfit.checkpoint import TrainerState, latest_checkpoint, load_checkpoint
from memfit.checkpoint.export import export_trained
from memfit.config import Config, from_mapping, to_yaml
from memfit.config.load import read_yaml
from memfit.config.schema import AdapterKind
from memfit.distributed.checkpoint import gathered_state_dict
from memfit.monitor.memory import RECORD_PEAK_KEY, make_memory_meter
from memfit.monitor.memory_plot import plot_memory
from memfit.monitor.metrics import MetricsLogger, read_metrics
from memfit.monitor.progress import ProgressBar
from memfit.training.build import build_run
from memfit.training.fit import auto_fit, refuse_too_large_preset
from memfit.training.loop import train_steps


@dataclass
class RunResult:
    output_dir: Path
    steps: int
    losses: dict[int, float] = field(default_factory=dict)
    eval_losses: dict[int, float] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


def _as_config(config: Config | dict | str | Path) -> Config:
    if isinstance(config, Config):
        return config
    if isinstance(config, (str, Path)):
        return from_mapping(read_yaml(config))
    return from_mapping(config)


def _new_run_dir(config: Config) -> Path:
    if config.train.output_dir:
        run_dir = Path(config.train.output_dir)
        if (run_dir / "config.yaml").exists():
            raise ConfigError(
                f"train.output_dir={run_dir} already holds a run; resume it with "
                f"--resume {run_dir} or choose another folder"
            )
        return run_dir
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


def train(config: Config | dict | str | Path, resume: str | Path | None = None) -> RunResult:
    """Train from a Config, a mapping shaped like the YAML file, or a YAML path.

    ``resume``: a run folder; training continues from its newest checkpoint.
    With distributed.strategy=fsdp this joins (or creates) the process group first.
    """
    config = _as_config(config)
    distributed.setup(config)
    try:
        return _train(config, resume)
    finally:
        distributed.teardown()


class _SilentLogger:
    """The metrics sink of ranks other than 0: rank 0 logs the reduced values."""

    def log(self, record: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def _train(config: Config, resume: str | Path | None) -> RunResult:
    main = distributed.is_main()
    refuse_too_large_preset(config)
    choice = None
    if config.memory.auto and resume is None:  # a resumed run keeps what was chosen
        config, choice = auto_fit(config)
        print(f"memfit: memory.auto chose {choice['strategy']}: {choice['reason']}",
              file=sys.stderr)
    run = build_run(config)
    if resume is not None:
        run_dir = Path(resume)
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is None:
            raise ConfigError(f"--resume {run_dir}: no checkpoint under {run_dir / 'checkpoints'}")
        state = load_checkpoint(checkpoint, run.model, run.optimizer, run.scheduler, run.scaler)
    else:
        # Rank 0's choice: a default folder name holds the time, which ranks may disagree on.
        run_dir = distributed.broadcast_from_main(_new_run_dir(config) if main else None)
        if main:
            run_dir.mkdir(parents=True, exist_ok=True)
        state = TrainerState()
    header = (f"# memory.auto chose {choice['strategy']}: {choice['reason']}\n"
              if choice else "")
    if main:
        write_text(run_dir / "config.yaml", header + to_yaml(config))

    budget = parse_bytes(config.memory.budget) if config.memory.budget else None
    meter = make_memory_meter(run.device, budget, every_n_steps=config.log.memory_every)
    meter.attach(run.model, run.optimizer)
    logger = MetricsLogger(run_dir, tensorboard=config.log.tensorboard) if main \
        else _SilentLogger()
    bar = ProgressBar(run.total_steps, state.step, enabled=config.log.progress and main)
    try:
        result = train_steps(run, run_dir, state, logger, meter, on_step=bar.update)
    finally:
        bar.close()
        logger.close()
    full_state = gathered_state_dict(run.model)  # collective; None when not sharded
    if not main:
        return RunResult(run_dir, result.state.step, result.losses, result.eval_losses)
    records = [r for r in read_metrics(run_dir) if RECORD_PEAK_KEY in r]
    if records:
        plot_memory(records, run_dir / "memory.png")
    has_adapter = config.adapter.kind is not AdapterKind.NONE
    exported = export_trained(run_dir, run.model, run.tokenizer, has_adapter, run.is_transformers,
                              state_dict=full_state)
    summary = _summary(run, result, run_dir, exported)
    if choice:
        summary["auto_fit"] = choice
    if meter.peak is not None:
        summary["memory_peak_bytes"] = meter.peak.peak_bytes
        summary["memory_peak_by_category"] = dict(meter.peak.by_category)
    write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    return RunResult(run_dir, result.state.step, result.losses, result.eval_losses, summary)


def _summary(run, result, run_dir: Path, exported: Path) -> dict[str, Any]:
    trainable = sum(p.numel() for p in run.trainable_parameters)
    total = sum(p.numel() for p in run.model.parameters())
    losses = [result.losses[step] for step in sorted(result.losses)]
    evals = result.eval_losses
    return {
        "output_dir": str(run_dir),
        "steps": result.state.step,
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "eval_loss_before": evals.get(0),
        "eval_loss_after": evals[max(evals)] if evals else None,
        "tokens": result.state.tokens,
        "train_seconds": result.state.elapsed_seconds,
        "trainable_parameters": trainable,
        "total_parameters": total,
        "device": str(run.device),
        "exported": str(exported),
    }
