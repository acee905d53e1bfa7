"""An optimizer's moments (``OptimizerSpec.moments``'s default): the optimizer step, or,
with ``optimizer.layerwise``, the updates inside backward (memfit.optim.LayerwiseOptimizer:
each gradient is consumed by its hook as it appears, so no moment holds them all).
"""

from __future__ import annotations

from memfit.techniques.moments import Moment, StepBytes, moment
from memfit.techniques.optimizers.setting import OptimizerSetting


def step_moments(step: StepBytes, setting: OptimizerSetting) -> list[Moment]:
    if setting.optimizer.layerwise:
        return layerwise_moments(step)
    if setting.offloaded:
        why = ("the step runs on the host (memory.optimizer_offload): the device keeps every "
               "grad and the step's inputs")
        scratch = 0
    else:
        why = ("every grad and the optimizer's scratch at the worst moment of its step, the "
               "step's inputs still alive")
        scratch = -(-step.optimizer.step_scratch_bytes // step.devices)
    return [moment("optimizer step", why, step.grads, step.inputs, scratch)]


def layerwise_moments(step: StepBytes) -> list[Moment]:
    """In backward: the largest grad, consumed by its hook (under fsdp the running block's
    stay whole, under ddp one more is being all-reduced: ``beside_hook``), with one
    parameter's step scratch, at the backward moment with the most bytes besides grads;
    and the forward peak, before any grad. Accumulation buffers are alive at both."""
    backward, forward = step.backward, step.forward
    buffers = step.optimizer.accumulation_buffer_bytes
    return [
        moment("layer-wise update in backward",
               "a hook steps the largest parameter: its grad (and those still whole beside it) "
               "and its step's scratch at the backward moment with the most activations",
               step.largest_grad + step.beside_hook, backward["activations"],
               backward["temporaries"] + step.optimizer.per_param_scratch_bytes + buffers),
        moment("forward before layer-wise updates",
               "the forward peak: no grad exists yet, every accumulation buffer does",
               0, forward["activations"], forward["temporaries"] + buffers),
    ]
