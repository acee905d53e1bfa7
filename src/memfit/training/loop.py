"""The training loop, explicit and short. One optimizer step:

1. draw ``gradient_accumulation_steps`` micro-batches and count their loss items
   (tokens for language models, examples otherwise) -> ``items``;
2. the step itself (memfit.training.step): for each micro-batch forward and backward of
   ``loss_sum / items`` — so the gradient is that of the mean over the EFFECTIVE batch;
   unscale (fp16), clip the global norm; judge the step (memfit.training.nonfinite): a nan
   or inf loss or gradient norm stops the run or skips the update; optimizer step, zero
   grads; then the scheduler step;
4. log (with the step's memory from the meter), evaluate, checkpoint (weights checked finite);
5. on SIGTERM/SIGINT received during the step (memfit.training.interrupts): checkpoint there
   if not just saved, and stop.

The step runs inside ``meter.step(step)``, which measures the steps ``log.memory_every``
says and on CPU enforces ``memory.budget`` (evaluation too, inside ``meter.evaluation()``).
An OOM in forward/backward zeroes the gradients, moves one rung down ``recovery.next_rung``
and retries the same step from the same examples; an OOM in evaluation halves the eval batch.

Distributed (memfit.distributed): each rank runs its share of every micro-batch; ``items``
and the step loss are summed over ranks, so the loss is normalised over the GLOBAL
effective batch and FSDP and DDP sum (not average) the gradients; the verdict on a non-finite step
follows from that loss and the global norm, and a stop signal on any rank is summed at each
step boundary, so all ranks stop at the same step. Every rank evaluates the same
eval items (FSDP's all-gathers need all ranks in every forward). An OOM is not retried:
the ranks would disagree on the micro-batch, so the job stops with the error.
"""

from __future__ import annotations

import gc
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from memfit import distributed
from memfit._utils.atomic import write_text
from memfit._utils.errors import MemfitWarning, OutOfMemoryPlanError
from memfit._utils.sizes import parse_bytes
from memfit.checkpoint import TrainerState, save_checkpoint
from memfit.config import to_yaml
from memfit.config.schema import AdapterKind, OomRung
from memfit.data import count_positions
from memfit.distributed import sequence_parallel
from memfit.monitor.memory import MemoryMeter, StepMemory
from memfit.monitor.metrics import MetricsLogger
from memfit.techniques.optimizer_offload import HostOffloadOptimizer
from memfit.techniques.precision import autocast
from memfit.training.batches import BatchStream, eval_batches
from memfit.training.build import Run
from memfit.training.interrupts import Interrupted, StopRequests
from memfit.training.nonfinite import DivergenceGuard, Verdict
from memfit.training.recovery import Rung, next_rung, rebuild, smaller_eval_batch
from memfit.training.sample_answers import answer_sample_prompts
from memfit.training.step import (
    OptimizerStepOutOfMemory,
    optimizer_step,
    step_parts,
    steps_in_backward,
    to_device,
)


@dataclass
class LoopResult:
    state: TrainerState
    losses: dict[int, float] = field(default_factory=dict)  # steps whose update was applied
    eval_losses: dict[int, float] = field(default_factory=dict)
    # The highest measured training step of this call (evaluations are not what a user
    # sizes a GPU by); None when log.memory_every skipped them all.
    peak: StepMemory | None = None
    peak_step: int | None = None
    measured_steps: int = 0  # training steps of this call whose memory was measured


def evaluate(run: Run) -> dict[str, float] | None:
    """The objective's metrics over the eval split, or its first train.eval_max_batches
    micro-batches (None when there is none): ``loss`` (mean per item) and those of its task
    (``Objective.eval_metrics``)."""
    if len(run.splits.eval) == 0:
        return None
    run.model.eval()
    totals: dict[str, torch.Tensor] = {}
    items = 0
    # FSDP2 reuses its all-gather buffers in training, which inference tensors cannot be.
    no_grad = torch.no_grad() if distributed.is_distributed() else torch.inference_mode()
    with no_grad, autocast(run.config.precision, run.device):
        max_batches = run.config.train.eval_max_batches
        limit = None if max_batches is None else max_batches * run.config.train.micro_batch_size
        for batch in eval_batches(run.splits.eval, run.eval_batch_size, run.collate, limit):
            batch = to_device(batch, run.device, run.config.precision)
            for name, value in run.objective.eval_sums(run.model, batch).items():
                value = value.to("cpu", torch.float64)  # float64: sums over the whole split
                totals[name] = totals[name] + value if name in totals else value
            items += run.objective.count(batch)
    run.model.train()
    return run.objective.eval_metrics(totals, items)


def _eval_record(step: int, metrics: dict[str, float]) -> dict:
    return {"step": step, **{f"eval_{name}": value for name, value in metrics.items()}}


def _available_bytes(run: Run) -> int | None:
    """The memory a rung must fit: memory.budget, else the GPU's; None on a CPU without a
    budget (no limit to plan against) or with memory.oom_rung=in_order: the ladder's order
    decides."""
    if run.config.memory.oom_rung is OomRung.IN_ORDER:
        return None
    if run.config.memory.budget:
        return parse_bytes(run.config.memory.budget)
    if run.device.type == "cuda":
        return torch.cuda.get_device_properties(run.device).total_memory
    return None


def _out_of_memory(run: Run, where: str, step: int, failure: str) -> OutOfMemoryPlanError:
    budget = run.config.memory.budget
    limit = f"memory.budget={budget}" if budget else f"the {run.device} device"
    return OutOfMemoryPlanError(
        f"out of memory {where} at step {step} within {limit} and no cheaper setting is left "
        f"to try; run `memfit plan` with your config for what fits "
        f"({failure.splitlines()[0][:160]})")


def _apply_rung(run: Run, rung: Rung, stream: BatchStream, logger: MetricsLogger,
                meter: MemoryMeter, step: int, run_dir: Path) -> None:
    if rung.needs_rebuild:
        rebuild(run, rung.config)
        meter.attach(run.model, run.optimizer)
    run.config = rung.config
    write_text(run_dir / "config.yaml", to_yaml(run.config))  # resume continues with it
    stream.micro_batch_size = rung.config.train.micro_batch_size
    logger.log({"step": step, "event": "out_of_memory", "change": rung.description})
    warnings.warn(f"out of memory at step {step}; retrying with {rung.description}",
                  MemfitWarning, stacklevel=2)


def _host_bytes(run: Run) -> dict[str, int]:
    """Host memory the offload techniques hold (their bytes leave the device's count; on a
    CPU device the meter's host pool, memory_host_peak_bytes, counts them too)."""
    found = {}
    if run.config.memory.activation_offload:
        found["host_activation_peak_bytes"] = run.activation_offload.peak_host_bytes
        run.activation_offload.reset_peak()
    if isinstance(run.optimizer, HostOffloadOptimizer):
        found["host_optimizer_bytes"] = run.optimizer.host_bytes()
    return found


def _input_tokens(micro_batches: list[dict[str, torch.Tensor]], seconds: float,
                  copies: int = 1) -> dict[str, int | float]:
    """The tokens a step fed the model (``tokens``: prompts too, padding not, over all
    ranks; what other tools' tokens per second count), their rate, and the share of the
    (batch x longest) positions that were padding; {} without tokens. ``copies``: how many
    ranks hold each micro-batch (distributed.sequence_parallel)."""
    counts = [count_positions(batch) for batch in micro_batches]
    tokens = distributed.all_reduce_sum(sum(tokens for tokens, _ in counts)) // copies
    positions = distributed.all_reduce_sum(sum(positions for _, positions in counts)) // copies
    if not positions:
        return {}
    return {"tokens": tokens, "tokens_per_second": tokens / seconds,
            "padding_fraction": 1 - tokens / positions}


def _release_failed_attempt(run: Run) -> None:
    """Free what a failed attempt allocated: its gradients, and (through a collection)
    the activations its exception's frames still referenced."""
    run.optimizer.zero_grad(set_to_none=True)
    gc.collect()


def _evaluate_within_memory(run: Run, meter: MemoryMeter, step: int) -> dict[str, float] | None:
    while True:
        try:
            with meter.evaluation():
                return evaluate(run)
        except torch.OutOfMemoryError as error:
            failure = str(error)
        _release_failed_attempt(run)
        run.model.train()
        smaller = smaller_eval_batch(run.eval_batch_size)
        if smaller is None:
            raise _out_of_memory(run, "in evaluation", step, failure)
        run.eval_batch_size = smaller
        warnings.warn(f"out of memory in evaluation; eval batch size -> {smaller}",
                      MemfitWarning, stacklevel=2)


def _save(run: Run, run_dir: Path, state: TrainerState, guard: DivergenceGuard) -> Path:
    guard.check_weights(run.model, state.step)
    guard.last_checkpoint = save_checkpoint(
        run_dir, state, run.model, run.optimizer, run.scheduler, run.scaler,
        keep=run.config.train.keep_checkpoints)
    return guard.last_checkpoint


def _agreed_stop_signal(requests: StopRequests) -> int | None:
    """The signal to stop on, the same on every rank: any rank's request stops them all
    (a rank that received none reports SIGTERM, which launchers forward)."""
    if not distributed.all_reduce_sum(int(requests.received is not None)):
        return None
    return requests.received or signal.SIGTERM


def train_steps(run: Run, run_dir: Path, state: TrainerState, logger: MetricsLogger,
                meter: MemoryMeter,
                on_step: Callable[[dict], None] = lambda record: None) -> LoopResult:
    """Steps ``state.step + 1`` to ``run.total_steps``. Raises TrainingDiverged on a
    non-finite step or weights, and Interrupted after SIGTERM/SIGINT (signals are handled
    only for the duration of this call)."""
    requests = StopRequests(second_sigint_aborts=not distributed.is_distributed())
    with requests.installed():
        return _train_steps(run, run_dir, state, logger, meter, on_step, requests)


def _train_steps(run: Run, run_dir: Path, state: TrainerState, logger: MetricsLogger,
                 meter: MemoryMeter, on_step: Callable[[dict], None],
                 requests: StopRequests) -> LoopResult:
    # The ranks of a sequence group (distributed.sequence_parallel) draw the same examples.
    data_rank, data_world = sequence_parallel.data_parallel(
        run.config.distributed.sequence_parallel)
    stream = BatchStream(run.splits.train, run.config.train.micro_batch_size,
                         run.config.train.seed, run.collate, consumed=state.consumed,
                         rank=data_rank, world_size=data_world)
    result = LoopResult(state)
    # The checkpoint this segment started from (a resume may have skipped damaged newer ones).
    started_from = run_dir / "checkpoints" / f"step-{state.step}"
    guard = DivergenceGuard(run.config.train, run.config.optimizer,
                            started_from if started_from.is_dir() else None,
                            scaler_checks_gradients=run.scaler is not None)
    if state.step == 0:
        metrics = (_evaluate_within_memory(run, meter, 0) if run.config.train.eval_at_start
                   else None)
        if metrics is not None:
            logger.log(_eval_record(0, metrics))
            result.eval_losses[0] = metrics["loss"]
        answer_sample_prompts(run, 0, logger)
        stop_signal = _agreed_stop_signal(requests)
        if stop_signal is not None:  # a step-0 checkpoint lets --resume start the run
            raise Interrupted(stop_signal, 0, _save(run, run_dir, state, guard), run_dir)
    run.model.train()
    adapters = run.config.adapter.kind is not AdapterKind.NONE
    state_at_start = state.step
    for step in range(state.step + 1, run.total_steps + 1):
        started = time.perf_counter()
        step_start = stream.consumed
        while True:  # retried with a cheaper rung after an OOM in forward/backward
            micro_batches = [stream.next_batch()
                             for _ in range(run.config.train.gradient_accumulation_steps)]
            items = distributed.all_reduce_sum(
                sum(run.objective.step_count(batch) for batch in micro_batches))
            lr = run.optimizer.param_groups[0]["lr"]
            try:
                with meter.step(step, micro_batches):
                    outcome = optimizer_step(
                        step_parts(run), micro_batches, items, judge=partial(guard.judge, step),
                        check_adapter_gradients=step == state_at_start + 1 and adapters)
                break
            except OptimizerStepOutOfMemory as error:
                raise _out_of_memory(run, "in the optimizer step", step, str(error)) from None
            except torch.OutOfMemoryError as error:
                failure = str(error)
            _release_failed_attempt(run)
            rung = None if (steps_in_backward(run.optimizer)
                            or not run.config.memory.recover_from_oom
                            or distributed.is_distributed()) else next_rung(
                                run.config, _available_bytes(run), run.device.type)
            if rung is None:  # layer-wise updates may already have stepped some weights
                raise _out_of_memory(run, "in forward/backward", step, failure)
            _apply_rung(run, rung, stream, logger, meter, step, run_dir)
            stream.consumed = step_start
        run.scheduler.step()
        step_loss, grad_norm, verdict = outcome.loss, outcome.grad_norm, outcome.verdict

        seconds = time.perf_counter() - started
        state.step, state.consumed = step, stream.consumed
        state.tokens += items
        state.elapsed_seconds += seconds
        if verdict is Verdict.APPLY:
            result.losses[step] = step_loss
        item = run.objective.item_name  # loss_tokens, or examples
        record = {"step": step, "loss": step_loss, "lr": lr, "grad_norm": grad_norm,
                  **_input_tokens(micro_batches, seconds,
                                  run.config.distributed.sequence_parallel), item: items,
                  f"{item}_per_second": items / seconds, "step_seconds": seconds,
                  "epoch": stream.epoch}
        state.input_tokens += record.get("tokens", 0)
        if guard.skipping:
            record.update(skipped=verdict is Verdict.SKIP, skipped_steps=guard.skipped_steps)
        if meter.last_step is not None:
            record.update(meter.last_step.to_record())
            result.measured_steps += 1
            if result.peak is None or meter.last_step.peak_bytes > result.peak.peak_bytes:
                result.peak, result.peak_step = meter.last_step, step
        record.update(_host_bytes(run))
        if run.replicas is not None:  # this rank's; every rank reduces the same bytes
            record["allreduce_bytes"] = run.replicas.reduced_bytes.take()
        # A skipped or diverged step is logged whatever log.every: it explains the outcome.
        unsound = verdict is not Verdict.APPLY
        if unsound or step % run.config.log.every == 0 or step == run.total_steps:
            logger.log(record)
        if verdict is Verdict.STOP:
            raise guard.diverged(step)
        on_step(record)
        train_config = run.config.train
        last = step == run.total_steps
        if (train_config.eval_every and step % train_config.eval_every == 0) or last:
            metrics = _evaluate_within_memory(run, meter, step)
            if metrics is not None:
                logger.log(_eval_record(step, metrics))
                result.eval_losses[step] = metrics["loss"]
            answer_sample_prompts(run, step, logger)
        saved = (train_config.save_every and step % train_config.save_every == 0) or last
        if saved:
            _save(run, run_dir, state, guard)
        stop_signal = _agreed_stop_signal(requests)
        if stop_signal is not None and not last:  # after the last step the run is complete
            checkpoint = guard.last_checkpoint if saved else _save(run, run_dir, state, guard)
            raise Interrupted(stop_signal, step, checkpoint, run_dir)
    return result
