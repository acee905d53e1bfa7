"""Frozen weights stored in the compute dtype (adapter.frozen_in_compute_dtype): with
adapters under bf16 or fp16 autocast, the frozen Linear weights are kept in that dtype
(techniques/quantize.py, store_frozen_in)."""

from __future__ import annotations

import torch
from torch import nn

from memfit.config.schema import AdapterKind, Precision
from memfit.techniques import quantize
from memfit.techniques.specs.spec import Setting, TechniqueOptions, TechniqueSpec


def frozen_storage_dtype(options: TechniqueOptions) -> torch.dtype | None:
    """The dtype frozen Linear weights are stored in, or None to leave them."""
    autocast = options.precision in (Precision.BF16, Precision.FP16)
    adapters = options.adapter.kind is not AdapterKind.NONE
    if not adapters or not autocast or not options.adapter.frozen_in_compute_dtype:
        return None
    return quantize.compute_dtype(options.precision)


def apply(model: nn.Module, setting: Setting) -> nn.Module:
    quantize.store_frozen_in(model, frozen_storage_dtype(setting.options))
    return model


SPEC = TechniqueSpec(
    name="frozen weights in the compute dtype",
    docs_row=("frozen Linear weights stored in the compute dtype under bf16/fp16 (same "
              "results, half the bytes)"),
    keys=("adapter.frozen_in_compute_dtype",),
    stage="model", enabled=lambda options: frozen_storage_dtype(options) is not None,
    plan="the meta model's weights are cast as training's",
    apply=apply, plan_apply=apply)
