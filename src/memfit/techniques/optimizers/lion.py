"""optimizer.name=lion: memfit.optim.Lion, the sign of interpolated momentum (Chen et al.
2023). Its own betas, (0.9, 0.99), where the config leaves optimizer.betas null; no eps.

State: one moment in the parameter's dtype. Scratch: the update direction of one
parameter. Elementwise, so under FSDP2 it steps each process's rows as they are.
"""

from __future__ import annotations

from memfit.optim.lion import Lion
from memfit.techniques.optimizers.options import resolved_option
from memfit.techniques.optimizers.setting import OptimizerSetting
from memfit.techniques.optimizers.spec import Factory, OptimizerSpec, Param, ParamCost, per_param
from memfit.techniques.optimizers.step_work import LION, streaming

LION_OPTIONS = {"betas": (0.9, 0.99)}  # the paper's defaults


def _factory(setting: OptimizerSetting) -> Factory:
    betas = tuple(resolved_option(setting.optimizer, "betas", LION_OPTIONS))
    return lambda groups: Lion(groups, lr=setting.optimizer.lr, betas=betas)


def _cost(param: Param, setting: OptimizerSetting) -> ParamCost:
    return ParamCost(param.nbytes, param.nbytes, param.nbytes)


SPEC = OptimizerSpec(
    name="lion",
    docs_row=("`memfit.optim.Lion` (Chen et al. 2023): every coordinate moves by lr in the "
              "sign of interpolated momentum and gradient; use a learning rate 3-10x below "
              "AdamW's", "4 bytes (fp32)"),
    options=LION_OPTIONS, factory=_factory, costs=per_param(_cost),
    step_work=streaming(LION), steps_local_rows=True)
