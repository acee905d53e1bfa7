"""Mixed precision (precision=bf16 or fp16): training.loop runs forward under the autocast
of techniques/precision.py; fp16 adds training.build's grad scaler."""

from __future__ import annotations

from memfit.config.schema import Precision
from memfit.techniques.specs.spec import TechniqueSpec

SPEC = TechniqueSpec(
    name="mixed precision",
    docs_row="mixed precision: autocast, fp16 with a grad scaler",
    keys=("precision=bf16", "precision=fp16"),
    stage="step",
    enabled=lambda options: options.precision in (Precision.BF16, Precision.FP16),
    plan="plan.itemize traces the micro-batch under the autocast training.loop runs "
         "forward in (techniques.precision; fp16 adds build's grad scaler)")
