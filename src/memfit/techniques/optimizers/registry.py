"""Every optimizer memfit knows, by optimizer.name (one spec file each), and the spec of
the one a config names (a class path gets class_path's)."""

from __future__ import annotations

from memfit.config.schema import Config, OptimizerName
from memfit.techniques.optimizers import adafactor, adamw, adamw8bit, class_path, galore, sgd
from memfit.techniques.optimizers.spec import OptimizerSpec

SPECS: dict[OptimizerName, OptimizerSpec] = {
    OptimizerName.ADAMW: adamw.SPEC,
    OptimizerName.ADAMW8BIT: adamw8bit.SPEC,
    OptimizerName.PAGED_ADAMW8BIT: adamw8bit.PAGED_SPEC,
    OptimizerName.ADAFACTOR: adafactor.SPEC,
    OptimizerName.GALORE: galore.SPEC,
    OptimizerName.SGD: sgd.SPEC,
}


def spec_for(config: Config) -> OptimizerSpec:
    name = config.optimizer.name
    if isinstance(name, OptimizerName):
        return SPECS[name]
    return class_path.spec(config)
