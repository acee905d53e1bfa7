"""Out-of-memory recovery: after an OOM in forward/backward, step down a ladder of cheaper
settings and retry the same optimizer step with the same examples.

The ladder, cheapest change in quality first (none of these changes the maths):
1. halve ``train.micro_batch_size`` and double ``train.gradient_accumulation_steps`` — the
   effective batch, its examples and the loss normalisation stay the same;
2. ``memory.activation_offload`` (saved activations move to host memory).
Each rung returns a new Config; the loop applies it and records the change.
"""

from __future__ import annotations

import dataclasses

from memfit.config.schema import Config


@dataclasses.dataclass(frozen=True)
class Rung:
    description: str
    config: Config


def next_rung(config: Config) -> Rung | None:
    """The next cheaper configuration, or None when the ladder is exhausted."""
    train, memory = config.train, config.memory
    if train.micro_batch_size > 1:
        # An odd micro-batch cannot be halved exactly; 1 keeps the effective batch.
        smaller = train.micro_batch_size // 2 if train.micro_batch_size % 2 == 0 else 1
        accumulation = train.gradient_accumulation_steps * train.micro_batch_size // smaller
        return Rung(
            f"train.micro_batch_size {train.micro_batch_size} -> {smaller}, "
            f"train.gradient_accumulation_steps {train.gradient_accumulation_steps} -> "
            f"{accumulation}",
            dataclasses.replace(config, train=dataclasses.replace(
                train, micro_batch_size=smaller, gradient_accumulation_steps=accumulation)),
        )
    if not memory.activation_offload:
        return Rung("memory.activation_offload false -> true", dataclasses.replace(
            config, memory=dataclasses.replace(memory, activation_offload=True)))
    return None


def smaller_eval_batch(batch_size: int) -> int | None:
    """Evaluation OOM shrinks the evaluation batch only (training's is untouched)."""
    return batch_size // 2 if batch_size > 1 else None
