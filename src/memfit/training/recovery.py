"""Out-of-memory recovery: after an OOM in forward/backward, take a rung of the planner's
ladder and retry the same optimizer step with the same examples: of the rungs that apply,
the one planned to fit the memory there is (memory.budget, or the GPU's) with the least
predicted step time (``plan.ladder.fastest_rung``); where none is planned to fit, or the
memory is not known, the ladder's next (``plan.strategies.next_cheaper``).

The ladder: split the micro-batch (accumulation grows so the effective batch, its examples
and the loss normalisation stay the same), then activation checkpointing, chunked loss,
8-bit optimizer state, activation offload, optimizer-state offload. Micro-batch and
activation-offload rungs apply to the running loop as they are; the others rebuild the
run (model, optimizer) from the new config and carry the trained weights, the optimizer
state (when the optimizer is unchanged), the schedule and the random state across.
"""

from __future__ import annotations

import dataclasses
import gc

import torch
from torch.utils._pytree import tree_map

from memfit._utils.errors import ConfigError
from memfit.config import to_mapping
from memfit.config.overrides import value_of, with_overrides
from memfit.config.schema import Config
from memfit.plan.ladder import fastest_rung
from memfit.plan.strategies import next_cheaper
from memfit.techniques.config_checks import from_mapping
from memfit.training.build import Run, build_run

# Rungs the loop applies without rebuilding anything.
LIVE_KEYS = {"train.micro_batch_size", "train.gradient_accumulation_steps",
             "memory.activation_offload"}


@dataclasses.dataclass(frozen=True)
class Rung:
    description: str
    config: Config
    needs_rebuild: bool


def next_rung(config: Config, available_bytes: int | None = None, device: str = "cpu"
              ) -> Rung | None:
    """The next cheaper configuration, or None when the ladder is exhausted (or its next
    rung is not valid for this config). With ``available_bytes`` (memory.budget, or the
    GPU's memory), of the rungs that apply the one planned to fit it with the least
    predicted step time (plan.ladder.fastest_rung); else the ladder's next."""
    overrides = (next_cheaper(config) if available_bytes is None
                 else fastest_rung(config, available_bytes, device))
    if overrides is None:
        return None
    try:
        cheaper = from_mapping(to_mapping(with_overrides(config, overrides)))
    except ConfigError:
        return None
    description = ", ".join(f"{key} {value_of(config, key)} -> {value}"
                            for key, value in overrides.items())
    # memory.offload_blocks: the blocks to offload are marked while the model is built.
    marks_blocks = ("memory.activation_offload" in overrides
                    and config.memory.offload_blocks is not None)
    return Rung(description, cheaper,
                needs_rebuild=marks_blocks or not set(overrides) <= LIVE_KEYS)


def smaller_eval_batch(batch_size: int) -> int | None:
    """Evaluation OOM shrinks the evaluation batch only (training's is untouched)."""
    return batch_size // 2 if batch_size > 1 else None


def _to_host(tree):
    return tree_map(lambda x: x.detach().to("cpu", copy=True) if torch.is_tensor(x) else x, tree)


def rebuild(run: Run, config: Config) -> None:
    """Replace ``run``'s model and optimizer by ones built for ``config``, continuing from
    the current training state. The old ones are freed first: both would not fit."""
    weights = {name: p.detach().to("cpu", copy=True)
               for name, p in run.model.named_parameters() if p.requires_grad}
    same_optimizer = (config.optimizer == run.config.optimizer
                      and config.memory.optimizer_offload == run.config.memory.optimizer_offload)
    optimizer_state = _to_host(run.optimizer.state_dict()) if same_optimizer else None
    scheduler_state = run.scheduler.state_dict()
    scaler_state = run.scaler.state_dict() if run.scaler else None
    rng_state = torch.get_rng_state()
    eval_batch_size = run.eval_batch_size
    run.model = run.optimizer = None  # type: ignore[assignment]
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

    fresh = build_run(config)  # re-seeds: the random state is put back below
    torch.set_rng_state(rng_state)
    parameters = dict(fresh.model.named_parameters())
    with torch.no_grad():
        for name, tensor in weights.items():
            parameters[name].copy_(tensor)
    if optimizer_state is not None:
        fresh.optimizer.load_state_dict(optimizer_state)
    fresh.scheduler.load_state_dict(scheduler_state)
    if scaler_state is not None and fresh.scaler is not None:
        fresh.scaler.load_state_dict(scaler_state)
    for field in dataclasses.fields(run):
        setattr(run, field.name, getattr(fresh, field.name))
    run.eval_batch_size = eval_batch_size
