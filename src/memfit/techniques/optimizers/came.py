"""optimizer.name=came: memfit.optim.CAME (Luo et al. 2023), Adafactor's factored second
moment with a first moment and a factored confidence that scales each step. Its betas,
(0.9, 0.999), where the config leaves optimizer.betas null, and its own key
optimizer.beta3, the decay of the confidence statistics; eps is the paper's (1e-30, 1e-16).

State, in the parameter's dtype: the first moment and two pairs of row and column means per
matrix, two values per value of a vector. Scratch: one parameter-sized tensor and, for a
matrix, row and column temporaries. Its statistics read whole rows and columns, so FSDP2's
row shards cannot step it: distributed.strategy=ddp trains it on several processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.config.fields import doc
from memfit.optim.came import CAME
from memfit.techniques.optimizers.options import own_options, resolved_option
from memfit.techniques.optimizers.setting import OptimizerSetting
from memfit.techniques.optimizers.spec import Factory, OptimizerSpec, Param, ParamCost, per_param
from memfit.techniques.optimizers.step_work import Passes, streaming

CAME_OPTIONS = {"betas": (0.9, 0.999)}  # the paper's defaults
# Counted from memfit.optim.CAME as step_work.py counts: G^2 and its means (6), the
# factored estimate times G (4), the clip (3), M (3), the instability and its means (7),
# the confident step (4), the decay and the update of W (5).
PASSES = Passes(32, 20)


@dataclass(frozen=True)
class CameOptions:
    beta3: float = doc(
        "CAME's decay of its confidence statistics (the row and column means of how far "
        "each update strays from the first moment); below 1.",
        limits=(0.0, 0.999999), default=0.9999)


def _factory(setting: OptimizerSetting) -> Factory:
    optimizer = setting.optimizer
    betas = tuple(resolved_option(optimizer, "betas", CAME_OPTIONS))
    beta3 = own_options(CameOptions, optimizer).beta3
    return lambda groups: CAME(groups, lr=optimizer.lr, betas=betas, beta3=beta3)


def _cost(param: Param, setting: OptimizerSetting) -> ParamCost:
    numel, shape, size = param.numel, param.shape, param.element_size
    if len(shape) < 2:
        return ParamCost(2 * param.nbytes, param.nbytes, param.nbytes)
    rows, columns = numel // shape[-1], numel // shape[-2]
    # The moment and two (rows, columns) pairs; the scratch, one tensor and their temporaries
    moment_and_means = param.nbytes + 2 * (rows + columns) * size
    return ParamCost(moment_and_means, moment_and_means, param.nbytes)


def _fsdp_refusal(setting: OptimizerSetting) -> str | None:
    return ("optimizer.name=came: its statistics read whole rows and columns, which FSDP2's "
            "row shards split")


SPEC = OptimizerSpec(
    name="came",
    docs_row=("`memfit.optim.CAME` (Luo et al. 2023): Adafactor's factored second moment, a "
              "first moment, and a factored confidence that shrinks untrusted steps",
              "m x n + 2 (m + n) values per m x n matrix, 2 per vector value"),
    options=CAME_OPTIONS, own=CameOptions, factory=_factory, costs=per_param(_cost),
    step_work=streaming(PASSES), fsdp_refusal=_fsdp_refusal)
