"""optimizer.name=adamw: torch's AdamW stepped in bounded batches (memfit.optim.BoundedAdamW),
or, for precision=bf16-pure, memfit's AdamW (fp32 moments, stochastic rounding into the
bf16 weights, row chunks).

State: exp_avg + exp_avg_sq in the parameter's dtype and a 0-d fp32 ``step`` (torch), or
fp32 moments (memfit). Scratch: sqrt(exp_avg_sq) of one batch of parameters (torch,
bounded by BATCH_BYTES), or a few fp32 row chunks of one parameter (memfit).
"""

from __future__ import annotations

from memfit.config.choices import GaloreInner
from memfit.config.schema import Precision
from memfit.optim.bounded_adamw import step_scratch_bound
from memfit.optim.inner import chunked_update_scratch_bytes
from memfit.techniques.optimizers.options import adam_options
from memfit.techniques.optimizers.setting import OptimizerSetting
from memfit.techniques.optimizers.spec import (
    LAYERWISE,
    PLAIN,
    PURE,
    PURE_LAYERWISE,
    BenchLine,
    Factory,
    OptimizerSpec,
    Param,
    ParamCost,
    largest_scratch,
    per_param,
)
from memfit.techniques.optimizers.step_work import ADAMW, streaming

# Adam's defaults (Loshchilov & Hutter 2019, as torch.optim.AdamW).
ADAM_OPTIONS = {"betas": (0.9, 0.999), "eps": 1e-8}


def _factory(setting: OptimizerSetting) -> Factory:
    if setting.precision is Precision.BF16_PURE:
        from memfit.optim import AdamW

        return lambda groups: AdamW(groups, **adam_options(setting.optimizer, ADAM_OPTIONS))
    from memfit.optim.bounded_adamw import BoundedAdamW

    return lambda groups: BoundedAdamW(groups, **adam_options(setting.optimizer, ADAM_OPTIONS))


def _cost(param: Param, setting: OptimizerSetting) -> ParamCost:
    if setting.precision is Precision.BF16_PURE:
        scratch = chunked_update_scratch_bytes(param.numel, GaloreInner.ADAMW)
        return ParamCost(8 * param.numel, scratch, param.nbytes)
    return ParamCost(2 * param.nbytes + 4, param.nbytes, param.nbytes)


def _step_scratch(params: list[Param], costs: list[ParamCost], setting: OptimizerSetting) -> int:
    if setting.precision is Precision.BF16_PURE:  # one parameter's row chunks at a time
        return largest_scratch(params, costs, setting)
    # The parameter groups (decayed matrices, the rest) are stepped one after the other.
    groups = ([p.nbytes for p in params if p.decayed], [p.nbytes for p in params if not p.decayed])
    return step_scratch_bound(groups)


SPEC = OptimizerSpec(
    name="adamw",
    docs_row=("`memfit.optim.BoundedAdamW`: torch's AdamW (foreach) stepped in batches of at "
              "most 64 MiB of parameters, so the step's scratch is one batch, not a whole "
              "group (same arithmetic and state_dict as torch's); with "
              "`precision=bf16-pure`, `memfit.optim.AdamW` (fp32 moments, update written "
              "back to the bf16 weight with stochastic rounding)", "8 bytes"),
    options=ADAM_OPTIONS,
    bench=(BenchLine("adamw", {"optimizer.name": "adamw"},
                     (PLAIN, LAYERWISE, PURE, PURE_LAYERWISE)),),
    factory=_factory,
    costs=per_param(_cost), step_work=streaming(ADAMW),
    plan_methods=(("full-adamw", {}),),
    step_scratch=_step_scratch,
    rounds_stochastically=True,
    # 8-bit AdamW rounds to nearest, so bf16-pure weights keep memfit's AdamW.
    cheaper=lambda setting: (None if setting.precision is Precision.BF16_PURE
                             else {"optimizer.name": "adamw8bit"}),
)
