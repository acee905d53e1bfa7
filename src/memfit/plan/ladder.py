"""The OOM ladder's rung that weighs time, as ``memfit plan --prefer quality`` does: of the
rungs that apply (strategies.rungs) and keep both the training's math and the optimizer's
state across the retry (a smaller micro-batch, checkpointing, chunked loss, activation
offload), the one planned to fit the memory available with the least predicted step time;
where none is planned to fit, the ladder's next rung in its order, as before a time model
existed (the rungs that rebuild the optimizer, 8-bit state or its offload, come last
there: recovery.rebuild starts their state afresh)."""

from __future__ import annotations

from memfit._utils.errors import MemfitError
from memfit.config.overrides import Overrides, with_overrides
from memfit.config.schema import Config
from memfit.plan.itemize import estimate
from memfit.plan.planned_device import planned_device
from memfit.plan.step_time import step_time
from memfit.plan.strategies import rungs


def fastest_rung(config: Config, available_bytes: int, device: str) -> Overrides | None:
    """The rung to take after an out-of-memory error on ``device`` ("cuda" or "cpu") with
    ``available_bytes`` of memory; None at the bottom of the ladder."""
    candidates = rungs(config)
    if len(candidates) < 2:
        return next(iter(candidates), None)
    profile = planned_device(device).profile
    fitting = []
    for overrides in candidates:
        if not set(overrides) <= KEEP_STATE:
            continue
        try:
            needs = estimate(with_overrides(config, overrides), device)
        except MemfitError:  # a rung this model cannot be planned at: not a choice
            continue
        if needs.device_bytes <= available_bytes:
            fitting.append((step_time(needs.work, profile).seconds, overrides))
    if fitting:
        return min(fitting, key=lambda found: found[0])[1]
    return candidates[0]


# The rungs' keys that keep the math and the optimizer's state (module docstring).
KEEP_STATE = {"train.micro_batch_size", "train.gradient_accumulation_steps",
              "memory.gradient_checkpointing", "memory.chunked_loss",
              "memory.activation_offload"}
