"""A peak moment: one instant of a run, what is alive on one device then (by category) and
why. The planner's peak is the largest of the moments its contributors name: the traced
micro-batch and the run around the steps (evaluation, saving; plan/moments.py), the
optimizer's spec (``OptimizerSpec.moments``), the distribution strategy's spec
(``StrategySpec.moments``) and the techniques' specs (``TechniqueSpec.moments``: loading
the base quantized). ``StepBytes`` is what they make their moments of.

Weights and optimizer state are alive at every moment of a step, so a moment holds only the
categories that change within it (``MOMENT_CATEGORIES``); the planner adds the other two.
"""

from __future__ import annotations

from dataclasses import dataclass

# What changes from one moment of a step to the next (weights and state do not).
MOMENT_CATEGORIES = ("grads", "activations", "temporaries")

Split = dict[str, int]  # bytes by category at one moment


@dataclass(frozen=True)
class Moment:
    name: str  # what users read: "optimizer step", "DDP bucket rebuild", ...
    bytes: Split  # MOMENT_CATEGORIES' bytes alive then, on one device
    why: str  # one line: what is alive then, and why

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


def moment(name: str, why: str, grads: int, activations: int, temporaries: int) -> Moment:
    return Moment(name, {"grads": grads, "activations": activations,
                         "temporaries": temporaries}, why)


def of_split(name: str, why: str, split: Split) -> Moment:
    """A moment holding a traced split's grads, activations and temporaries."""
    return Moment(name, {category: split[category] for category in MOMENT_CATEGORIES}, why)


@dataclass(frozen=True)
class OptimizerCost:
    """What an optimizer allocates, added up over the trainable parameters (plan/costs.py)."""

    state_bytes: int  # persistent optimizer state
    step_scratch_bytes: int  # extra bytes alive at the worst moment of optimizer.step()
    per_param_scratch_bytes: int  # the same for one parameter at a time (layer-wise step)
    accumulation_buffer_bytes: int  # layer-wise with accumulation: where grads accumulate


@dataclass(frozen=True)
class StepBytes:
    """One training step as one device holds it: the traced micro-batch (with FSDP2's
    gathered units and divided gradients where ``gathered``), and what the planner costed.
    The splits hold all five categories; moments take MOMENT_CATEGORIES of them."""

    first_micro_batch: Split  # the trace's most live bytes, its grads as the device holds them
    forward: Split  # the most bytes besides grads before backward (no grad yet)
    backward: Split  # ... among the moments of backward, grads left out
    grads: int  # every gradient the device holds at the end of backward
    largest_grad: int  # the largest trainable parameter's gradient
    inputs: int  # input bytes alive during optimizer.step()
    optimizer: OptimizerCost
    devices: int  # devices weights, grads and state are divided over (1: not divided)
    gathered: bool  # the splits are FSDP2's: gathered units, gradients divided or on the host
    buckets: int  # DDP's gradient buckets (0: DDP does not wrap the model)
    beside_hook: int  # layer-wise: gradients alive whole beside the one a hook consumes
    # The device is the host (CPU): what a save writes through host memory is device bytes.
    host_is_device: bool = False
    # What quantizing the base holds beyond the stored weights while it loads
    # (quantize_stand_in.quantizing_bytes; 0 without a quantized base).
    quantizing: int = 0

    @property
    def without_grads(self) -> Split:
        """The most bytes besides grads: before or in backward."""
        return max(self.forward, self.backward,
                   key=lambda split: sum(split.values()) - split["grads"])

    @property
    def later_micro_batch(self) -> Split:
        """A later micro-batch of an accumulating step: every grad alive from the earlier
        ones (DDP's: its buckets), plus the one being added to them, beside the trace's most
        bytes other than grads."""
        without = self.without_grads
        return {"grads": self.grads, "activations": without["activations"],
                "temporaries": without["temporaries"] + self.largest_grad}
