"""The memory techniques, one spec each (techniques/specs/, one file per technique), in
the one order both training (``training.build``) and the planner (``plan.meta``) apply
them, and the functions that walk them.

Training applies the techniques stage by stage, and within a stage in list order:

    load       while the model loads (training.build.load_base)
    model      on the loaded model, before it moves to its device (prepare_model)
    device     on the model on its device, or before FSDP2 shards it
    optimizer  on the built optimizer
    step       around each forward pass and its loss (training.loop, training.objective)

The planner applies every ``plan_apply`` in list order on the meta model. The one
technique whose stage reorders it is the quantized base (specs/quantized_base.py): training
quantizes while loading, the planner puts its stand-in in after the adapters; the same
modules with the same bytes.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from memfit.config.schema import MemoryConfig
from memfit.techniques.specs import (
    activation_offload,
    adapters,
    checkpointing,
    chunked_loss,
    freeze_blocks,
    freeze_embeddings,
    frozen_in_compute_dtype,
    mixed_precision,
    optimizer_offload,
    pure_bf16,
    quantized_base,
    tiled_mlp,
    tiled_norms,
)
from memfit.techniques.specs.frozen_in_compute_dtype import frozen_storage_dtype
from memfit.techniques.specs.pure_bf16 import planned_weights_dtype
from memfit.techniques.specs.quantized_base import load_quantization
from memfit.techniques.specs.spec import (
    STAGES,
    BlockRule,
    Setting,
    Stage,
    TechniqueSpec,
    setting,
)
from memfit.techniques.technique_options import TechniqueOptions

# What training and the planner use of the specs, through this module.
__all__ = ["STAGES", "TECHNIQUES", "BlockKind", "Setting", "Stage", "TechniqueOptions",
           "TechniqueSpec", "all_of_kind", "apply_stage", "block_kinds", "check_applied",
           "frozen_storage_dtype", "load_quantization", "plan_apply", "planned_weights_dtype",
           "setting"]

TECHNIQUES: tuple[TechniqueSpec, ...] = (
    checkpointing.SPEC,
    activation_offload.SPEC,  # marks memory.offload_blocks' blocks, before PEFT renames them
    tiled_mlp.SPEC,
    tiled_norms.SPEC,
    adapters.SPEC,
    freeze_embeddings.SPEC,
    freeze_blocks.SPEC,
    quantized_base.SPEC,
    frozen_in_compute_dtype.SPEC,
    pure_bf16.SPEC,
    mixed_precision.SPEC,
    chunked_loss.SPEC,
    optimizer_offload.SPEC,
)


def apply_stage(stage: Stage, subject: Any, setting: Setting) -> Any:
    """Training: every enabled technique of ``stage`` applied to ``subject``, in order."""
    for spec in TECHNIQUES:
        if spec.stage == stage and spec.apply is not None and spec.enabled(setting.options):
            subject = spec.apply(subject, setting)
    return subject


def check_applied(model: nn.Module, options: TechniqueOptions) -> list[str]:
    """Training's "did it apply?" checks of every enabled technique, stage by stage;
    returns their warnings (a technique that did not apply raises ConfigError)."""
    warnings = []
    for spec in sorted(TECHNIQUES, key=lambda spec: STAGES.index(spec.stage)):
        if spec.enabled(options):
            warnings += spec.check_applied(model, options)
    return warnings


# A block's kind: for each enabled technique acting on some blocks (its spec's
# ``BlockRule``), in list order, whether it acts on that block.
BlockKind = tuple[bool, ...]


def _block_rules(options: TechniqueOptions) -> list[BlockRule]:
    return [spec.blocks for spec in TECHNIQUES
            if spec.blocks is not None and spec.enabled(options)]


def block_kinds(options: TechniqueOptions, depth: int, named: str) -> list[BlockKind]:
    """Each of ``depth`` blocks' kind, input side first (the planner's stand-ins)."""
    acting = [rule.acts_on(options.memory, depth, named) for rule in _block_rules(options)]
    return list(zip(*acting, strict=True)) if acting else [()] * depth


def all_of_kind(options: TechniqueOptions, kind: BlockKind) -> MemoryConfig:
    """memory.* with every block of ``kind``, at any depth (a planner's stand-in)."""
    memory = options.memory
    for rule, acts in zip(_block_rules(options), kind, strict=True):
        memory = rule.everywhere(memory, acts)
    return memory


def plan_apply(model: nn.Module, setting: Setting) -> nn.Module:
    """The planner: every enabled technique's view applied to the meta model, in order."""
    for spec in TECHNIQUES:
        if spec.plan_apply is not None and spec.enabled(setting.options):
            model = spec.plan_apply(model, setting)
    return model
