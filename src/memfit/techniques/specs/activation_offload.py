"""Activation offload (memory.activation_offload): training.loop's forward and backward
inside techniques/activation_offload.py's ActivationOffload."""

from __future__ import annotations

from memfit.techniques.specs.spec import TechniqueSpec

SPEC = TechniqueSpec(
    name="activation offload",
    docs_row=("activation offload: saved activations kept in host memory between forward and "
              "backward"),
    keys=("memory.activation_offload",),
    stage="step", enabled=lambda config: config.memory.activation_offload,
    plan="plan.trace counts saved tensors as host bytes, where training.loop's "
         "ActivationOffload context keeps them")
