"""optimizer.name=sgd: torch's SGD without momentum: no state, no scratch."""

from __future__ import annotations

import torch

from memfit.techniques.optimizers.spec import OptimizerSpec, ParamCost, per_param
from memfit.techniques.optimizers.step_work import SGD, streaming

SPEC = OptimizerSpec(
    name="sgd",
    docs_row=("`torch.optim.SGD`", "none"),
    bench=(),  # no state: nothing for the memory benchmark to compare
    factory=lambda setting: lambda groups: torch.optim.SGD(groups, lr=setting.optimizer.lr),
    costs=per_param(lambda param, setting: ParamCost(0, 0, param.nbytes)),
    step_work=streaming(SGD))
