"""Before building anything: refuse presets that cannot fit this machine, and apply the
planner's recommendation when ``memory.auto`` is on. Both use the planner's numbers.

With several processes, rank 0 plans for all of them (``memory.budget`` per device) and
hands its choice to the others, so every rank trains the same configuration.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from memfit import distributed
from memfit._utils.errors import MemfitError
from memfit._utils.sizes import parse_bytes
from memfit.config import Config, to_mapping
from memfit.config.overrides import with_overrides
from memfit.config.schema import Task
from memfit.data import build_datasets, collate
from memfit.models.architectures import ARCHITECTURES
from memfit.models.classifier import class_labels, with_classes
from memfit.plan.planner import recommend, refuse_if_too_large
from memfit.techniques.config_checks import from_mapping


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def available_bytes() -> int:
    """Device memory training can use here: the GPU's, or the host's RAM on CPU."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def refuse_too_large_preset(config: Config) -> None:
    """Real-architecture presets (7B, 70B ...) are planned, not trained, where they cannot
    fit: fail before allocating anything, quoting the plan."""
    if config.model.preset in ARCHITECTURES:
        refuse_if_too_large(config, available_bytes(), _device())


def example_batch(config: Config) -> dict[str, torch.Tensor] | None:
    """One training micro-batch from ``data.path``: what the planner traces a
    ``model.factory`` or image model with (it cannot guess a plain module's inputs). None
    for language models, whose inputs the planner makes from the config."""
    if not config.model.factory and config.model.task not in (Task.AUTOENCODER,
                                                               Task.IMAGE_CLASSIFICATION):
        return None
    config = with_classes(config)  # image classifiers: the batch holds class ids
    splits = build_datasets(config.data, None, seed=config.train.seed,
                            labels=class_labels(config.model))
    size = min(config.train.micro_batch_size, len(splits.train))
    return collate([splits.train[i] for i in range(size)])


def auto_fit(config: Config) -> tuple[Config, dict[str, Any]]:
    """``memory.auto``: the recommended strategy for ``memory.budget`` on each of this run's
    processes applied to the config, and a record of the choice (strategy, reason,
    overrides) for the run folder. Distributed, it is rank 0's plan on every rank."""
    outcome = _recommendation(config) if distributed.is_main() else None
    outcome = distributed.broadcast_from_main(outcome)
    if isinstance(outcome, MemfitError):
        raise outcome
    name, overrides, reason = outcome
    fitted = from_mapping(to_mapping(with_overrides(config, overrides)))
    return fitted, {"strategy": name, "reason": reason, "overrides": overrides}


def _recommendation(config: Config) -> tuple[str, dict[str, Any], str] | MemfitError:
    """The planner's (name, overrides, reason) for as many devices as processes; its
    error (nothing fits, a model that cannot be planned) is returned, to be raised on
    every rank rather than on rank 0 alone while the others wait for its choice."""
    try:
        return recommend(config, parse_bytes(config.memory.budget), _device(),
                         example_batch(config), devices=distributed.world_size())
    except MemfitError as error:
        return error
