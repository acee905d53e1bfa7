"""The peers' loops: how people fine-tune today (models and optimizers built by
bench.peer_models), run on the same model folder, batches and seed as memfit and measured
by memfit's meter. Each returns the records ``memfit.train`` writes to metrics.jsonl:
``step``, ``loss``, ``tokens``, ``step_seconds`` and, on measured steps, the meter's memory
keys.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memfit.bench.peer_models import BUILDERS, GALORE_TARGETS, Recipe, galore_settings, load_model
from memfit.config.schema import Config, Precision
from memfit.data import count_positions
from memfit.monitor.memory import MemoryMeter, make_memory_meter
from memfit.techniques.optimizers.options import adam_options
from memfit.techniques.optimizers.registry import spec_for
from memfit.training.step import StepParts, optimizer_step

Batch = dict[str, torch.Tensor]
Record = dict[str, Any]


def _is_measured(step: int, memory_every: int) -> bool:
    # The steps memfit.train measures with log.memory_every=k (see runner.memory_every).
    return step % memory_every == 0


def _model_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(**batch).loss  # transformers' mean over the batch's tokens


def _plain_loop(model: nn.Module, optimizer: torch.optim.Optimizer | None, batches: list[Batch],
                precision: Precision, memory_every: int, device: torch.device) -> list[Record]:
    """The loop a user writes: forward under autocast (``precision``), backward of ``.loss``
    (a mean), step, zero; one micro-batch a step, no clipping, no loss scaling.
    ``optimizer`` None: per-layer optimizers stepped in backward. Every ``memory_every``-th
    step measured (log.memory_every)."""
    meter = make_memory_meter(device)
    meter.attach(model, optimizer)
    model.train()
    parts = StepParts(model, optimizer, _model_loss, precision, device)
    records = []
    for step, batch in enumerate(batches, start=1):
        measured = _is_measured(step, memory_every)
        started = time.perf_counter()
        with meter.step() if measured else contextlib.nullcontext():
            loss = optimizer_step(parts, [batch], items=None).loss
        records.append(_record(step, loss, batch, time.perf_counter() - started,
                               meter if measured else None))
    return records


def _record(step: int, loss: float, batch: Batch, seconds: float,
            meter: MemoryMeter | None) -> Record:
    record = {"step": step, "loss": loss, "tokens": count_positions(batch)[0],
              "step_seconds": seconds}
    if meter is not None and meter.last_step is not None:
        record.update(meter.last_step.to_record())
    return record


def hf_trainer_galore(folder: Path, config: Config, batches: list[Batch],
                      device: torch.device) -> list[Record]:
    """``transformers.Trainer`` with ``optim="galore_adamw_layerwise"``, fed the same
    pre-collated batches in order; a callback wraps each step in the meter."""
    from torch.utils.data import SequentialSampler
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class InOrderTrainer(Trainer):
        def _get_train_sampler(self, train_dataset=None) -> SequentialSampler:
            return SequentialSampler(self.train_dataset)

    meter = make_memory_meter(device)
    records: dict[int, Record] = {}

    class Measure(TrainerCallback):
        def __init__(self) -> None:
            self.measuring = contextlib.ExitStack()
            self.started = 0.0

        def on_train_begin(self, args, state, control, model=None, optimizer=None, **_):
            meter.attach(model, optimizer)

        def on_step_begin(self, args, state, control, **_):
            step = state.global_step + 1
            if _is_measured(step, config.log.memory_every):
                self.measuring.enter_context(meter.step())
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **_):
            self.measuring.close()  # leaves meter.step() if this step entered it
            step = state.global_step
            records[step] = _record(step, float("nan"), batches[step - 1],
                                    time.perf_counter() - self.started,
                                    meter if _is_measured(step, config.log.memory_every)
                                    else None)

        def on_log(self, args, state, control, logs=None, **_):
            if logs and "loss" in logs and state.global_step in records:
                records[state.global_step]["loss"] = float(logs["loss"])

    galore = galore_settings(config.optimizer.galore)
    adam = adam_options(config.optimizer, spec_for(config.optimizer).options)
    arguments = TrainingArguments(
        output_dir=str(Path(config.train.output_dir) / "trainer"), max_steps=len(batches),
        per_device_train_batch_size=1, learning_rate=config.optimizer.lr,
        adam_beta1=adam["betas"][0], adam_beta2=adam["betas"][1],
        adam_epsilon=adam["eps"], weight_decay=config.optimizer.weight_decay,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=0.0,
        optim="galore_adamw_layerwise", optim_target_modules=list(GALORE_TARGETS),
        optim_args=", ".join(f"{key}={value}" for key, value in galore.items()
                             if key != "proj_type"),
        bf16=config.precision is Precision.BF16, use_cpu=device.type == "cpu",
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        seed=config.train.seed, remove_unused_columns=False, dataloader_num_workers=0)
    trainer = InOrderTrainer(model=load_model(folder, device), args=arguments,
                             train_dataset=batches, data_collator=_first,
                             callbacks=[Measure()])
    trainer.train()
    return [records[step] for step in sorted(records)]


def _first(items: list[Batch]) -> Batch:
    # Each dataset item is already a collated micro-batch (per_device_train_batch_size=1).
    return items[0]


HF_TRAINER_GALORE = "hf-trainer-galore"
# The peers a bench case can name: a builder (bench.peer_models) run in the plain loop, or
# the Hugging Face Trainer, which runs its own.
PEERS = (*BUILDERS, HF_TRAINER_GALORE)


def run_peer(peer: str, folder: Path, config: Config, batches: list[Batch],
             device: torch.device) -> list[Record]:
    """Train the peer named ``peer`` (one of PEERS) on ``batches``; its records."""
    if peer == HF_TRAINER_GALORE:
        return hf_trainer_galore(folder, config, batches, device)
    built = BUILDERS[peer](folder, Recipe.of(config), device)
    return _plain_loop(built.model, built.optimizer, batches, config.precision,
                       config.log.memory_every, device)


def batches_like_memfit(config: Config, tokenizer: Any) -> Iterator[Batch]:
    """The micro-batches ``memfit.train`` draws for ``config``, in its order."""
    from memfit.data import build_datasets, collate
    from memfit.training.batches import BatchStream

    splits = build_datasets(config.data, tokenizer, seed=config.train.seed)
    pad = tokenizer.pad_token_id
    stream = BatchStream(splits.train, config.train.micro_batch_size, config.train.seed,
                         lambda examples: collate(examples, pad_token_id=pad))
    while True:
        yield stream.next_batch()
