"""The peak moments a distribution strategy adds to a training step (``StrategySpec.moments``;
the bytes each device holds are plan/per_device.py's).

ddp   PyTorch DDP (``gradient_as_bucket_view=True``) keeps the gradients it reduces in flat
      buckets allocated when it wraps the model, alive for the whole step, the first
      micro-batch's forward included; and it rebuilds them once, in the order the first
      backward filled them, at the start of the second step's forward, the new ones
      allocated before the old are freed.
fsdp  FSDP2 divides the gradients over the processes (or moves them to the host), so the
      step can peak without them: in forward, its gathered units beside the activations,
      or in backward once the gradients reduced so far are divided.
"""

from __future__ import annotations

from memfit.techniques.moments import Moment, StepBytes, moment, of_split


def ddp_moments(step: StepBytes) -> list[Moment]:
    if not step.buckets:  # layer-wise updates, or nothing DDP reduces
        return []
    first = step.first_micro_batch
    # Two upper bounds of the same moment, the smaller kept: the traced peak with every
    # bucket added (the grads the trace already holds counted twice), or a later
    # micro-batch's (grads DDP does not reduce counted as if all were alive).
    with_buckets = {"grads": first["grads"] + step.buckets,
                    "activations": first["activations"], "temporaries": first["temporaries"]}
    bound = min(with_buckets, step.later_micro_batch, key=lambda split: sum(split.values()))
    return [
        of_split("first micro-batch beside DDP's buckets",
                 "the first micro-batch's forward and backward with every gradient bucket "
                 "alive from the start of the step", bound),
        moment("DDP bucket rebuild",
               "the second step's forward: DDP's buckets rebuilt in backward's order, the "
               "new ones beside the old, with the step's inputs",
               2 * step.buckets, step.inputs, 0),
    ]


def fsdp_moments(step: StepBytes) -> list[Moment]:
    if not step.gathered:  # one process that keeps its shards on the device: nothing divided
        return []
    return [
        of_split("FSDP2 forward",
                 "the forward peak with the root unit and two blocks gathered, no grad yet",
                 {**step.forward, "grads": 0}),
        of_split("FSDP2 backward, grads divided",
                 "backward's most activations with the units gathered for it, the gradients "
                 "reduced so far divided over the processes (left out)",
                 {**step.backward, "grads": 0}),
    ]


def no_moments(step: StepBytes) -> list[Moment]:
    return []
