"""optimizer.name=sgd: torch's SGD; with its own key optimizer.momentum > 0 it keeps one
momentum buffer per parameter (in the parameter's dtype), without momentum no state."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memfit.config.fields import doc
from memfit.techniques.optimizers.options import own_options
from memfit.techniques.optimizers.setting import OptimizerSetting
from memfit.techniques.optimizers.spec import Factory, OptimizerSpec, Param, ParamCost
from memfit.techniques.optimizers.step_work import SGD, SGD_MOMENTUM, streaming
from memfit.techniques.work import Work


@dataclass(frozen=True)
class SgdOptions:
    momentum: float = doc(
        "Momentum factor of torch.optim.SGD (0: plain SGD, no state; e.g. 0.9 keeps a "
        "momentum buffer the size of each trained parameter).", limits=(0.0, 1.0), default=0.0)


def _factory(setting: OptimizerSetting) -> Factory:
    momentum = own_options(SgdOptions, setting.optimizer).momentum
    return lambda groups: torch.optim.SGD(groups, lr=setting.optimizer.lr, momentum=momentum)


def _costs(params: list[Param], setting: OptimizerSetting) -> list[ParamCost]:
    """State: the momentum buffer, in the parameter's dtype, where there is momentum."""
    momentum = own_options(SgdOptions, setting.optimizer).momentum
    return [ParamCost(param.nbytes if momentum else 0, 0, param.nbytes) for param in params]


def _step_work(params: list[Param], costs: list[ParamCost], setting: OptimizerSetting) -> Work:
    momentum = own_options(SgdOptions, setting.optimizer).momentum
    return streaming(SGD_MOMENTUM if momentum else SGD)(params, costs, setting)


SPEC = OptimizerSpec(
    name="sgd",
    docs_row=("`torch.optim.SGD`", "none; with `optimizer.momentum` > 0 one buffer the size "
                                   "of the parameter"),
    own=SgdOptions,
    bench=(),  # no state by default: nothing for the memory benchmark to compare
    factory=_factory, costs=_costs, step_work=_step_work)
