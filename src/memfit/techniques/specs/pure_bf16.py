"""Pure bf16 weights (precision=bf16-pure): no fp32 master copy; the optimizer rounds its
bf16 updates stochastically (an optimizer spec's rounds_stochastically)."""

from __future__ import annotations

import torch
from torch import nn

from memfit.config.schema import Precision
from memfit.models.load import TORCH_DTYPES
from memfit.techniques.specs.spec import Setting, TechniqueOptions, TechniqueSpec


def planned_weights_dtype(options: TechniqueOptions) -> torch.dtype:
    """The dtype the planner builds the meta model in: model.dtype, or bfloat16 for
    precision=bf16-pure."""
    if options.precision is Precision.BF16_PURE:
        return torch.bfloat16
    return TORCH_DTYPES[options.model.dtype]


def apply(model: nn.Module, setting: Setting) -> nn.Module:
    return model.to(torch.bfloat16)


SPEC = TechniqueSpec(
    name="pure bf16 weights",
    docs_row="pure bf16: bf16 weights, updated with stochastic rounding",
    keys=("precision=bf16-pure",),
    stage="device", enabled=lambda options: options.precision is Precision.BF16_PURE,
    plan="plan.meta builds the model in planned_weights_dtype (bfloat16)",
    apply=apply)
