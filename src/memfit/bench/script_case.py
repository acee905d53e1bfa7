"""One benchmarks/ script case built inside its own process: the case's memfit config on a
model folder, and what it trains — memfit's model and optimizer prepared as
``memfit.train`` prepares them, or a peer's (bench.peer_models)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from memfit.bench.peer_models import BUILDERS, ModelAndOptimizer, Recipe
from memfit.config.schema import Config


def case_config(folder: Path, overrides: Mapping[str, Any]) -> Config:
    """memfit's defaults for the model in ``folder``, then ``overrides`` (``section.key:
    value``, values as on the command line)."""
    from memfit.config.load import parse_overrides
    from memfit.techniques.config_checks import from_mapping

    # data.path only has to exist: the scripts feed their own batch, not a dataset.
    settings = {"model.path": folder, "data.path": folder, **overrides}
    return from_mapping(parse_overrides([f"{key}={value}" for key, value in settings.items()]))


def memfit_training(config: Config, device: torch.device) -> ModelAndOptimizer:
    """memfit's model and optimizer for ``config``, built through the same technique stages
    as ``memfit.train`` (quantization, checkpointing, adapters; bf16-pure weights on the
    device; host offload around the optimizer), without a dataset."""
    from memfit.techniques.optimizers import OptimizerSetting
    from memfit.techniques.technique_options import TechniqueOptions
    from memfit.training.build import load_base, place_and_optimize, prepare_model, seed_everything

    seed_everything(0)
    loaded = load_base(config)
    options = TechniqueOptions.of(config)
    model, _ = prepare_model(loaded, options)
    return ModelAndOptimizer(*place_and_optimize(model, options, OptimizerSetting.of(config),
                                                 loaded.is_transformers, device))


def peer_training(peer: str, folder: Path, config: Config,
                  device: torch.device) -> ModelAndOptimizer:
    """The peer named ``peer`` (a key of bench.peer_models.BUILDERS), seeded as memfit's
    cases are (LoRA's initialization draws from it)."""
    from memfit.training.build import seed_everything

    seed_everything(0)
    return BUILDERS[peer](folder, Recipe.of(config), device)
