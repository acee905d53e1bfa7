"""optimizer.name=adafactor: torch's Adafactor; under FSDP2 memfit.optim.Adafactor, the
same update on each process's rows, with the column statistics and norms summed over the
processes.

No first moment, relative step size always on (lr is the maximum step), eps=(None, 1e-3)
= eps1 from the dtype; see docs/optimizers.md. State: the factored second moment (row and
column means) of >= 2-D tensors, a full one for vectors, and a 0-d ``step``. Scratch: two
parameter-sized temporaries of one parameter.
"""

from __future__ import annotations

import torch

from memfit.config.schema import DistributedStrategy
from memfit.techniques.optimizers.setting import OptimizerSetting
from memfit.techniques.optimizers.spec import (
    Factory,
    OptimizerSpec,
    Param,
    ParamCost,
    per_param,
)
from memfit.techniques.optimizers.step_work import ADAFACTOR, streaming


def _factory(setting: OptimizerSetting) -> Factory:
    if setting.strategy is DistributedStrategy.FSDP:
        from memfit.optim import Adafactor

        return lambda groups: Adafactor(groups, lr=setting.optimizer.lr)
    return lambda groups: torch.optim.Adafactor(groups, lr=setting.optimizer.lr)


def _cost(param: Param, setting: OptimizerSetting) -> ParamCost:
    numel, shape = param.numel, param.shape
    rows_and_columns = (numel // shape[-1] + numel // shape[-2] if len(shape) >= 2 else numel)
    return ParamCost(rows_and_columns * param.element_size + 4, 2 * param.nbytes, param.nbytes)


SPEC = OptimizerSpec(
    name="adafactor",
    docs_row=("`torch.optim.Adafactor` (see below)", "(m + n) x 4 bytes per m x n matrix"),
    factory=_factory, costs=per_param(_cost), step_work=streaming(ADAFACTOR), steps_local_rows=True,
    plan_methods=(("full-adafactor", {}),))
