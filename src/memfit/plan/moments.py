"""The candidate peaks of a run as named moments (memfit.techniques.moments), collected
from their contributors, and the one that sets the peak:

- the traced micro-batch (here): the first micro-batch's forward and backward, and, when
  accumulating, a later micro-batch (every grad already alive, plus the one being added);
- the run around the steps (here): evaluation and saving;
- the enabled techniques' specs (``TechniqueSpec.moments``): quantizing the base as it
  loads;
- the optimizer's spec (``OptimizerSpec.moments``): its step, or layer-wise updates inside
  backward, which replace the trace's moments (no moment holds every grad);
- the distribution strategy's spec (``StrategySpec.moments``): DDP's buckets and their
  rebuild, FSDP2's moments without grads.
"""

from __future__ import annotations

from memfit.techniques import registry
from memfit.techniques.distribution import strategy_for
from memfit.techniques.moments import Moment, StepBytes, moment, of_split
from memfit.techniques.optimizers import OptimizerSetting, spec_for


def trace_moments(step: StepBytes, layerwise: bool, accumulation_steps: int) -> list[Moment]:
    """The traced micro-batch's moments (optimizer.layerwise, train.gradient_accumulation_steps)."""
    if layerwise:  # each grad is consumed as it appears: the optimizer's
        return []
    first = step.first_micro_batch
    gathered = (", FSDP2's gathered units and a block's whole gradients beside it"
                if step.gathered else "")
    moments = [of_split(f"first micro-batch's {'backward' if first['grads'] else 'forward'}",
                        f"the traced micro-batch at its most live bytes{gathered}", first)]
    if accumulation_steps > 1:
        moments.append(of_split("later micro-batch",
                                "accumulating: every grad of the earlier micro-batches and the "
                                "one being added, beside the trace's most bytes besides grads",
                                step.later_micro_batch))
    return moments


def run_moments(step: StepBytes) -> list[Moment]:
    """The moments of a run outside its steps that training/loop.py and api.py make: an
    evaluation (a forward without grad, after a step has freed the grads: at most the
    traced forward's bytes, which also hold what backward would keep) and the checkpoint
    and export (each trainable tensor copied at most once while written; PEFT's adapter
    state dict, safetensors' contiguous copies: in host memory, which is the device's on a
    CPU; from a GPU, one tensor at a time is on the device while it is copied out)."""
    copies = step.grads if step.host_is_device else step.largest_grad
    return [of_split("evaluation", "a forward without grad beside the weights and state",
                     {**step.forward, "grads": 0}),
            moment("saving", "the checkpoint and export: what trains, copied at most once "
                   "(on a GPU, one tensor at a time on the device)",
                   grads=0, activations=0, temporaries=copies)]


def technique_moments(step: StepBytes, options: registry.TechniqueOptions) -> list[Moment]:
    return [found for spec in registry.TECHNIQUES
            if spec.moments is not None and spec.enabled(options)
            for found in spec.moments(step, options)]


def step_moments(step: StepBytes, setting: OptimizerSetting,
                 options: registry.TechniqueOptions) -> list[Moment]:
    """Every contributor's moments of the whole run, the trace's first."""
    optimizer = spec_for(setting.optimizer).moments(step, setting)
    return [*trace_moments(step, setting.optimizer.layerwise, setting.accumulation_steps),
            *optimizer, *strategy_for(setting.strategy).moments(step),
            *run_moments(step), *technique_moments(step, options)]


def peak(moments: list[Moment]) -> Moment:
    """The moment with the most bytes (of equal ones, the first named)."""
    return max(moments, key=lambda moment: moment.total)
