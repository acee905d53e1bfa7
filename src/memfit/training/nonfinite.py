"""Divergence: what a nan or inf loss, gradient norm or weight does to a run.

Each step is judged after backward and clipping, before the optimizer applies it, from
the step's loss (summed over ranks) and its global gradient norm, so every rank of a
distributed run reaches the same verdict. ``train.on_nonfinite=stop`` stops the run at
that step; ``skip`` drops the step's update, up to ``train.max_consecutive_skips`` steps in
a row. With a gradient scaler (fp16) inf/nan gradients are the scaler's normal signal to
skip and lower its scale, so only the loss counts there.

A finite loss does not prove finite weights (an update can overflow them), so the weights
are checked before every checkpoint: a checkpoint, and the export made from the last one,
never holds nan or inf.
"""

from __future__ import annotations

import math
import warnings
from enum import Enum
from pathlib import Path

import torch
from torch import nn

from memfit import distributed
from memfit._utils.errors import MemfitWarning, TrainingDiverged
from memfit.config.schema import NonfiniteAction, OptimizerConfig, TrainConfig

# Elements checked at once: bounds the bool temporary for a large weight (16 MiB).
_CHUNK_ELEMENTS = 1 << 24


class Verdict(Enum):
    APPLY = "apply"
    SKIP = "skip"
    STOP = "stop"


def _describe(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def nonfinite_quantity(loss: float, grad_norm: float, scaler_checks_gradients: bool) -> str | None:
    """What became non-finite ("loss became nan"), or None when the step is sound."""
    if not math.isfinite(loss):
        return f"loss became {_describe(loss)}"
    if not math.isfinite(grad_norm) and not scaler_checks_gradients:
        return f"gradient norm became {_describe(grad_norm)}"
    return None


def first_nonfinite_weight(model: nn.Module) -> str | None:
    """Name of this rank's first trainable weight holding nan or inf (its local shard when
    sharded), or None."""
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        chunks = local.detach().reshape(-1).split(_CHUNK_ELEMENTS)
        if chunks and not bool(torch.stack([chunk.isfinite().all() for chunk in chunks]).all()):
            return name
    return None


class DivergenceGuard:
    """The verdict on each step, the skip counts, and the last checkpoint known finite."""

    def __init__(self, train: TrainConfig, optimizer: OptimizerConfig,
                 last_checkpoint: Path | None, scaler_checks_gradients: bool):
        self.train, self.optimizer = train, optimizer  # train.on_nonfinite ..., for remedies
        self.last_checkpoint = last_checkpoint
        self.scaler_checks_gradients = scaler_checks_gradients
        self.skipped_steps = 0
        self.consecutive_skips = 0
        self.problem: str | None = None

    @property
    def skipping(self) -> bool:
        return self.train.on_nonfinite is NonfiniteAction.SKIP

    def judge(self, step: int, loss: float, grad_norm: float) -> Verdict:
        self.problem = nonfinite_quantity(loss, grad_norm, self.scaler_checks_gradients)
        if self.problem is None:
            self.consecutive_skips = 0
            return Verdict.APPLY
        limit = self.train.max_consecutive_skips
        if not self.skipping or self.consecutive_skips >= limit:
            return Verdict.STOP
        self.consecutive_skips += 1
        self.skipped_steps += 1
        warnings.warn(f"{self.problem} at step {step}; its update was skipped "
                      f"({self.consecutive_skips} in a row, train.max_consecutive_skips={limit})",
                      MemfitWarning, stacklevel=2)
        return Verdict.SKIP

    def diverged(self, step: int) -> TrainingDiverged:
        """The error for the step ``judge`` stopped."""
        after = ""
        if self.skipping:
            after = (f" after {self.consecutive_skips} skipped steps in a row "
                     f"(train.max_consecutive_skips={self.train.max_consecutive_skips})")
        return self._error(f"{self.problem} at step {step}{after}", offer_skip=not self.skipping)

    def check_weights(self, model: nn.Module, step: int) -> None:
        """Raise TrainingDiverged when any rank's trainable weights hold nan or inf."""
        name = first_nonfinite_weight(model)
        if distributed.all_reduce_sum(int(name is not None)):
            where = f" ({name} first)" if name else ""
            # Checked at saves only: the update that overflowed may be a few steps older.
            raise self._error(f"weights became non-finite{where} by step {step} although the "
                              "loss and gradient norm were finite", offer_skip=False)

    def _error(self, what: str, offer_skip: bool) -> TrainingDiverged:
        checkpoint = self.last_checkpoint or "none was saved"
        remedies = [f"lower optimizer.lr (now {self.optimizer.lr})"]
        if self.train.max_grad_norm is None:
            remedies.append("set train.max_grad_norm")
        if offer_skip and not self.optimizer.layerwise:
            remedies.append("use train.on_nonfinite=skip")
        advice = ", ".join(remedies[:-1]) + (", or " if len(remedies) > 1 else "") + remedies[-1]
        return TrainingDiverged(f"{what}; last finite checkpoint: {checkpoint}; {advice}")
