"""The training loop, explicit and short. One optimizer step:

1. draw ``gradient_accumulation_steps`` micro-batches and count their loss items
   (tokens for language models, examples otherwise) -> ``items``;
2. for each micro-batch: forward under autocast (and activation offload), backward of
   ``loss_sum / items`` — so the gradient is that of the mean over the EFFECTIVE batch;
3. unscale (fp16), clip the global norm, optimizer step, scheduler step, zero grads;
4. log, evaluate, checkpoint.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from memfit.checkpoint import TrainerState, save_checkpoint
from memfit.monitor.metrics import MetricsLogger
from memfit.techniques import activation_offload
from memfit.training.batches import BatchStream, eval_batches
from memfit.training.build import Run
from memfit.training.precision import autocast


@dataclass
class LoopResult:
    state: TrainerState
    losses: dict[int, float] = field(default_factory=dict)
    eval_losses: dict[int, float] = field(default_factory=dict)


def _to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


def evaluate(run: Run) -> float | None:
    """Mean eval loss per item over the whole eval split (None when there is none)."""
    if len(run.splits.eval) == 0:
        return None
    run.model.eval()
    total, items = 0.0, 0
    with torch.inference_mode(), autocast(run.config.precision, run.device):
        for batch in eval_batches(run.splits.eval, run.config.train.micro_batch_size, run.collate):
            batch = _to_device(batch, run.device)
            total += run.objective.loss_sum(run.model, batch).item()
            items += run.objective.count(batch)
    run.model.train()
    return total / max(items, 1)


def _eval_record(step: int, loss: float) -> dict:
    return {"step": step, "eval_loss": loss, "eval_perplexity": math.exp(min(loss, 50.0))}


def train_steps(run: Run, run_dir: Path, state: TrainerState, logger: MetricsLogger,
                on_step: Callable[[dict], None] = lambda record: None) -> LoopResult:
    config = run.config.train
    stream = BatchStream(run.splits.train, config.micro_batch_size, config.seed, run.collate,
                         consumed=state.consumed)
    result = LoopResult(state)
    if state.step == 0:
        loss = evaluate(run)
        if loss is not None:
            logger.log(_eval_record(0, loss))
            result.eval_losses[0] = loss
    run.model.train()
    max_norm = config.max_grad_norm if config.max_grad_norm is not None else math.inf
    for step in range(state.step + 1, run.total_steps + 1):
        started = time.perf_counter()
        micro_batches = [stream.next_batch() for _ in range(config.gradient_accumulation_steps)]
        items = sum(run.objective.count(batch) for batch in micro_batches)
        step_loss = 0.0
        for batch in micro_batches:
            batch = _to_device(batch, run.device)
            with autocast(run.config.precision, run.device), activation_offload.context(
                run.config.memory.activation_offload, run.device
            ):
                loss_sum = run.objective.loss_sum(run.model, batch)
            loss = loss_sum / max(items, 1)
            (run.scaler.scale(loss) if run.scaler else loss).backward()
            step_loss += loss.item()
        if run.scaler:
            run.scaler.unscale_(run.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(run.trainable_parameters, max_norm)
        lr = run.optimizer.param_groups[0]["lr"]
        if run.scaler:
            run.scaler.step(run.optimizer)
            run.scaler.update()
        else:
            run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)

        seconds = time.perf_counter() - started
        state.step, state.consumed = step, stream.consumed
        state.tokens += items
        state.elapsed_seconds += seconds
        result.losses[step] = step_loss
        record = {"step": step, "loss": step_loss, "lr": lr, "grad_norm": float(grad_norm),
                  "tokens": items, "tokens_per_second": items / seconds,
                  "step_seconds": seconds, "epoch": stream.epoch}
        if step % run.config.log.every == 0 or step == run.total_steps:
            logger.log(record)
        on_step(record)
        last = step == run.total_steps
        if (config.eval_every and step % config.eval_every == 0) or last:
            loss = evaluate(run)
            if loss is not None:
                logger.log(_eval_record(step, loss))
                result.eval_losses[step] = loss
        if (config.save_every and step % config.save_every == 0) or last:
            save_checkpoint(run_dir, state, run.model, run.optimizer, run.scheduler, run.scaler,
                            keep=config.keep_checkpoints)
    return result
