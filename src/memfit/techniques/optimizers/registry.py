"""Every optimizer memfit knows, by optimizer.name (one spec file each), and the spec of
the one a config names (a class path gets class_path's). One line per optimizer below."""

from __future__ import annotations

from memfit._utils.errors import ConfigError
from memfit.config.schema import OptimizerConfig
from memfit.techniques.optimizers import (
    adafactor,
    adamw,
    adamw8bit,
    came,
    class_path,
    galore,
    lion,
    sgd,
)
from memfit.techniques.optimizers.spec import OptimizerSpec

SPECS: dict[str, OptimizerSpec] = {spec.name: spec for spec in (
    adamw.SPEC,
    adamw8bit.SPEC,
    adamw8bit.PAGED_SPEC,
    adafactor.SPEC,
    galore.SPEC,
    sgd.SPEC,
    lion.SPEC,
    came.SPEC,
)}


def is_class_path(name: str) -> bool:
    """A class path 'package.module:Class' (or 'file.py:Class'); no built-in name has a
    colon."""
    return ":" in name


def spec_for(optimizer: OptimizerConfig) -> OptimizerSpec:
    """The spec of the optimizer optimizer.name names; a ConfigError naming the choices for
    an unknown name."""
    name = optimizer.name
    if name in SPECS:
        return SPECS[name]
    if is_class_path(name):
        return class_path.spec(optimizer)
    raise ConfigError(f"optimizer.name={name!r} is not one of: {', '.join(SPECS)}, or a class "
                      "path 'package.module:Class' of a torch.optim.Optimizer")
