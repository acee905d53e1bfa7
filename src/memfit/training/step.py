"""One optimizer step, written once for the training loop, the planner's accuracy tests
and ``memfit bench``'s peers, so what is measured is what trains:

1. for each micro-batch: forward under autocast (and activation offload), backward of
   ``loss_sum / items`` (scaled by the GradScaler with fp16) — so the gradient is that of
   the mean over the EFFECTIVE batch; the step's loss is summed over ranks; under
   data parallel (``StepParts.replicas``) the forward goes through DDP, only the last
   micro-batch's backward reduces, and memfit's own reductions follow it;
2. unscale (fp16) and clip the global gradient norm;
3. the verdict on the step (the loop's ``nonfinite.DivergenceGuard``: apply, skip or stop;
   without a judge every step applies);
4. the update unless the verdict drops it, the scaler's update, zero grads.

What memfit's optimizers say about themselves (a torch optimizer needs neither):

- ``steps_in_backward = True`` (``memfit.optim.LayerwiseOptimizer``): its hooks update each
  parameter inside backward, clipped per tensor; it needs ``begin_micro_batch(index)``
  before each micro-batch, and its ``step()`` only publishes ``grad_norm``.
- ``projected_gradients()`` (``memfit.optim.GaLore``): the gradients projected in backward
  (R = P^T G, held instead of ``.grad``), which the global norm counts and clipping scales.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim import Optimizer

from memfit import distributed
from memfit.config.schema import Precision
from memfit.distributed.ddp import Replicas
from memfit.optim.backward_projection import clip_grad_norm_
from memfit.techniques import lora
from memfit.techniques.precision import autocast
from memfit.training.build import Run
from memfit.training.nonfinite import Verdict

Batch = dict[str, torch.Tensor]


class OptimizerStepOutOfMemory(torch.OutOfMemoryError):
    """Out of memory after backward (clipping or the update): the optimizer may have
    updated some of its state, so the step cannot be retried."""


@dataclass
class StepParts:
    """What one optimizer step works on: a training run's (``step_parts``) or a model,
    optimizer and loss a caller built itself (a bench peer's)."""

    model: nn.Module
    # None: the model's own hooks update it inside backward (a peer's per-layer optimizers).
    optimizer: Optimizer | None
    # A micro-batch's loss summed over its items (the step divides it by the step's items),
    # or already a mean (a step given items=None backpropagates it as it is).
    loss_sum: Callable[[nn.Module, Batch], torch.Tensor]
    precision: Precision
    device: torch.device
    # Whether the global gradient norm of the trainable weights is measured, and clipped
    # to max_grad_norm when that is set (a peer's loop does neither).
    measure_grad_norm: bool = False
    max_grad_norm: float | None = None
    scaler: torch.amp.GradScaler | None = None
    activation_offload: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    # distributed.strategy=ddp: forward through DDP and sum the gradients across processes.
    replicas: Replicas | None = None

    def __post_init__(self) -> None:
        if self.max_grad_norm is not None and not self.measure_grad_norm:
            raise ValueError("max_grad_norm needs measure_grad_norm=True")


@dataclass(frozen=True)
class StepOutcome:
    loss: float  # mean per item over the effective batch (all ranks)
    grad_norm: float | None  # pre-clip global norm; None unless StepParts.measure_grad_norm
    verdict: Verdict


def step_parts(run: Run) -> StepParts:
    """The parts of ``run`` as they are now (an OOM rung may rebuild its model)."""
    return StepParts(
        model=run.model, optimizer=run.optimizer, loss_sum=run.objective.loss_sum,
        precision=run.config.precision, device=run.device, measure_grad_norm=True,
        max_grad_norm=run.config.train.max_grad_norm, scaler=run.scaler,
        activation_offload=lambda: run.activation_offload.context(
            run.config.memory.activation_offload,
            in_blocks_only=run.config.memory.offload_blocks is not None),
        replicas=run.replicas)


def steps_in_backward(optimizer: Optimizer | None) -> bool:
    return getattr(optimizer, "steps_in_backward", False)


def to_device(batch: Batch, device: torch.device, precision: Precision) -> Batch:
    """Move a batch to the device; with bf16-pure weights (no autocast to reconcile dtypes)
    floating inputs such as images become bf16 too."""
    pure = precision is Precision.BF16_PURE
    return {key: value.to(device, dtype=torch.bfloat16 if pure and value.is_floating_point()
                          else value.dtype, non_blocking=True)
            for key, value in batch.items()}


def optimizer_step(parts: StepParts, micro_batches: list[Batch], items: int | None,
                   judge: Callable[[float, float | None], Verdict] | None = None,
                   check_adapter_gradients: bool = False) -> StepOutcome:
    """One optimizer step over ``micro_batches``, whose loss items (summed over ranks) are
    ``items`` (None: ``parts.loss_sum`` gives means, backpropagated undivided).
    ``judge(loss, grad_norm)`` decides between clipping and the update;
    ``check_adapter_gradients`` (a run's first step) fails when no gradient reached the
    LoRA adapters. An OOM in forward/backward propagates as it is (nothing was updated);
    one after backward raises OptimizerStepOutOfMemory."""
    in_backward = steps_in_backward(parts.optimizer)
    loss = distributed.all_reduce_sum(_forward_backward(parts, micro_batches, items,
                                                        in_backward))
    if check_adapter_gradients and not in_backward:  # layer-wise hooks consumed them
        lora.check_gradients_reached(parts.model)  # checkpointing can cut them
    try:
        grad_norm = _clip(parts, in_backward)
        verdict = judge(loss, grad_norm) if judge is not None else Verdict.APPLY
        _update(parts, in_backward, verdict)
    except torch.OutOfMemoryError as error:
        raise OptimizerStepOutOfMemory(str(error)) from error
    if parts.replicas is not None:
        parts.replicas.zero_grad()
    elif parts.optimizer is not None:
        parts.optimizer.zero_grad(set_to_none=True)
    return StepOutcome(loss, grad_norm, verdict)


def _forward_backward(parts: StepParts, micro_batches: list[Batch], items: int | None,
                      in_backward: bool) -> float:
    """Backward of ``loss_sum / items`` for each micro-batch; returns the step's mean loss
    (its tensors are freed on return, before clipping and the update)."""
    step_loss = 0.0
    replicas = parts.replicas
    for index, batch in enumerate(micro_batches):
        if in_backward:
            parts.optimizer.begin_micro_batch(index)  # its hooks step on the last one
        batch = to_device(batch, parts.device, parts.precision)
        last = index == len(micro_batches) - 1
        with replicas.micro_batch(last) if replicas else contextlib.nullcontext():
            with autocast(parts.precision, parts.device), parts.activation_offload():
                loss_sum = (replicas.forward(parts.loss_sum, parts.model, batch) if replicas
                            else parts.loss_sum(parts.model, batch))
            loss = loss_sum / max(items, 1) if items is not None else loss_sum
            (parts.scaler.scale(loss) if parts.scaler else loss).backward()
        step_loss += loss.item()
    if replicas:
        replicas.after_backward()
    return step_loss


def _clip(parts: StepParts, in_backward: bool) -> float | None:
    """Unscale (fp16) and clip; returns the pre-clip global gradient norm. Layer-wise: the
    updates already ran in backward, clipped per tensor, and step() only reports the norm."""
    if in_backward:
        parts.optimizer.step()
        return float(parts.optimizer.grad_norm)
    if parts.scaler:
        parts.scaler.unscale_(parts.optimizer)
    if not parts.measure_grad_norm:
        return None
    # Listed after backward: FSDP2 leaves its root's parameters unsharded after a forward
    # without backward (evaluation) and registers the sharded ones, which hold the
    # gradients, only in backward.
    trainable = [p for p in parts.model.parameters() if p.requires_grad]
    projected = getattr(parts.optimizer, "projected_gradients", list)()
    return float(clip_grad_norm_(trainable, parts.max_grad_norm, projected))


def _update(parts: StepParts, in_backward: bool, verdict: Verdict) -> None:
    """Apply the clipped gradients, unless the verdict drops them (zero_grad then discards
    them, GaLore's projected ones included)."""
    if in_backward or parts.optimizer is None:
        return
    if verdict is Verdict.APPLY:
        if parts.scaler:
            parts.scaler.step(parts.optimizer)
        else:
            parts.optimizer.step()
    if parts.scaler:  # lowers the scale after inf gradients, and ends unscale_'s step
        parts.scaler.update()
