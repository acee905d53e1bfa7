"""optimizer.name=sgd: torch's SGD without momentum: no state, no scratch."""

from __future__ import annotations

import torch

from memfit.config.schema import Config
from memfit.techniques.optimizers.spec import (
    Factory,
    OptimizerSpec,
    Param,
    ParamCost,
    per_param,
)


def _factory(config: Config) -> Factory:
    return lambda groups: torch.optim.SGD(groups, lr=config.optimizer.lr)


def _cost(param: Param, config: Config) -> ParamCost:
    return ParamCost(0, 0, param.nbytes)


SPEC = OptimizerSpec(name="sgd", summary="SGD without momentum (torch)", factory=_factory,
                     costs=per_param(_cost))
