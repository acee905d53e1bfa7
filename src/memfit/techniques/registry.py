"""The memory techniques, one spec each, in the one order both training
(``training.build``) and the planner (``plan.meta``) apply them.

A spec says which config keys it answers to, when it is on, how training applies it, how
training checks that it applied ("did it apply?": raise, or return warnings), and the
planner's view: ``plan_apply`` on the meta model where the planner builds it too, and
``plan`` saying where the planner counts it otherwise.

Training applies the techniques stage by stage, and within a stage in list order:

    load       while the model loads (training.build.load_base)
    model      on the loaded model, before it moves to its device (prepare_model)
    device     on the model on its device, or before FSDP2 shards it
    optimizer  on the built optimizer
    step       around each forward pass and its loss (training.loop, training.objective)

The planner applies every ``plan_apply`` in list order on the meta model. The one
technique whose stage reorders it is the quantized base: training quantizes while loading
(Hugging Face folders are quantized by transformers as they load, so full-precision
weights never exist all at once), and the planner puts its stand-in in after the adapters
(PEFT wraps plain nn.Linear layers; the stand-in then replaces the frozen layer inside):
the same modules with the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from memfit.config.schema import AdapterKind, Config, DistributedStrategy, Precision, Task
from memfit.models.classifier import HEAD_SUFFIXES, head_names
from memfit.models.load import TORCH_DTYPES
from memfit.techniques import (
    checkpointing,
    chunked_loss,
    lora,
    quantize,
    quantize_stand_in,
    tiled_mlp,
)
from memfit.techniques.optimizer_offload import HostOffloadOptimizer, step_on_host

Stage = Literal["load", "model", "device", "optimizer", "step"]
STAGES: tuple[Stage, ...] = ("load", "model", "device", "optimizer", "step")


@dataclass(frozen=True)
class Setting:
    """What applying a technique needs beside the config."""

    config: Config
    is_transformers: bool
    device: str  # "cuda" or "cpu": the device trained on, or planned for
    # The loaded model's output layer, found before checkpointing and adapters wrap it.
    output_layer: nn.Module | None


def setting(model: nn.Module, config: Config, is_transformers: bool, device: str) -> Setting:
    get_head = getattr(model, "get_output_embeddings", None)
    return Setting(config, is_transformers, device, get_head() if callable(get_head) else None)


# apply(subject, setting) -> subject: the nn.Module in the load, model and device stages,
# the torch.optim.Optimizer in the optimizer stage.
Apply = Callable[[Any, Setting], Any]


@dataclass(frozen=True)
class TechniqueSpec:
    name: str
    keys: tuple[str, ...]  # config keys ("memory.chunked_loss") or values ("precision=fp16")
    stage: Stage
    enabled: Callable[[Config], bool]
    plan: str  # the planner's view, where plan_apply does not say it all
    apply: Apply | None = None  # None: the stage's code runs it (training.loop, objective)
    check_applied: Callable[[nn.Module], list[str]] | None = None  # warnings; raises ConfigError
    plan_apply: Callable[[nn.Module, Setting], nn.Module] | None = None  # on the meta model


def _adapters_on(config: Config) -> bool:
    return config.adapter.kind is not AdapterKind.NONE


def _qlora(config: Config) -> bool:
    return config.adapter.kind is AdapterKind.QLORA


def frozen_storage_dtype(config: Config) -> torch.dtype | None:
    """The dtype frozen Linear weights are stored in, or None to leave them."""
    autocast = config.precision in (Precision.BF16, Precision.FP16)
    if not _adapters_on(config) or not autocast or not config.adapter.frozen_in_compute_dtype:
        return None
    return quantize.compute_dtype(config.precision)


def planned_weights_dtype(config: Config) -> torch.dtype:
    """The dtype the planner builds the meta model in: model.dtype, or bfloat16 for
    precision=bf16-pure."""
    if config.precision is Precision.BF16_PURE:
        return torch.bfloat16
    return TORCH_DTYPES[config.model.dtype]


def load_quantization(config: Config):
    """transformers' BitsAndBytesConfig for a Hugging Face folder loaded with a quantized
    base, else None. The new head of a sequence classifier and adapter.trainable_modules
    stay unquantized (they train in full)."""
    if not (_qlora(config) and quantize.quantized_while_loading(config)):
        return None
    unquantized = list(config.adapter.trainable_modules)
    if config.model.task is Task.SEQUENCE_CLASSIFICATION:
        unquantized += HEAD_SUFFIXES
    return quantize.bnb_config(config.adapter, config.precision, unquantized)


def _quantize_base(model: nn.Module, setting: Setting) -> nn.Module:
    """Built models are quantized here, all but the output layer and
    adapter.trainable_modules; folders were while loading (``load_quantization``)."""
    config = setting.config
    if not quantize.quantized_while_loading(config):
        keep = lora.output_layer_names(model) | set(
            lora.resolve_trainable_modules(model, config.adapter.trainable_modules))
        quantize.quantize_linears(model, config.adapter, config.precision, keep)
    quantize.keep_training_layout(model)
    return model


def _stand_in_for_quantized_base(model: nn.Module, setting: Setting) -> nn.Module:
    config = setting.config
    quantize_stand_in.stand_in_for_frozen_linears(
        model, config, setting.output_layer,
        quantize_stand_in.quantized_path(config, setting.device))
    return model


def _checkpoint(model: nn.Module, setting: Setting) -> nn.Module:
    return checkpointing.apply(model, setting.config.memory, setting.is_transformers)


def _tile_mlp(model: nn.Module, setting: Setting) -> nn.Module:
    return tiled_mlp.apply(model, setting.config.memory.mlp_chunk_tokens)


def _checked(check: Callable[[nn.Module], None]) -> Callable[[nn.Module], list[str]]:
    def check_applied(model: nn.Module) -> list[str]:
        check(model)
        return []

    return check_applied


def _add_adapters(model: nn.Module, setting: Setting) -> nn.Module:
    classifies = setting.config.model.task is Task.SEQUENCE_CLASSIFICATION
    return lora.apply(model, setting.config.adapter,
                      classifier_head=head_names(model) if classifies else ())


def _store_frozen_in_compute_dtype(model: nn.Module, setting: Setting) -> nn.Module:
    quantize.store_frozen_in(model, frozen_storage_dtype(setting.config))
    return model


def _cast_to_bf16(model: nn.Module, setting: Setting) -> nn.Module:
    # No fp32 master copy: the optimizer rounds its bf16 updates stochastically.
    return model.to(torch.bfloat16)


def _offload_optimizer(optimizer: torch.optim.Optimizer, setting: Setting
                       ) -> torch.optim.Optimizer:
    if setting.config.distributed.strategy is DistributedStrategy.FSDP:
        # FSDP2's CPUOffloadPolicy holds the shards on the host already: step them there.
        return step_on_host(optimizer)
    return HostOffloadOptimizer(optimizer)


TECHNIQUES: tuple[TechniqueSpec, ...] = (
    TechniqueSpec(
        name="activation checkpointing",
        keys=("memory.gradient_checkpointing", "memory.checkpoint_modules",
              "memory.checkpoint_every"),
        stage="model", enabled=lambda config: config.memory.gradient_checkpointing,
        plan="traced: recomputed blocks keep only their inputs",
        # Before the adapters: PEFT renames the modules checkpointing looks for.
        apply=_checkpoint, check_applied=_checked(checkpointing.check_applied),
        plan_apply=_checkpoint),
    TechniqueSpec(
        name="tiled MLP",
        keys=("memory.tiled_mlp", "memory.mlp_chunk_tokens"),
        stage="model", enabled=lambda config: config.memory.tiled_mlp,
        plan="traced: the MLPs run chunk by chunk on the fake tensors, as in training",
        # Before the adapters; the trainable parameters are looked up at each call.
        apply=_tile_mlp, check_applied=_checked(tiled_mlp.check_applied),
        plan_apply=_tile_mlp),
    TechniqueSpec(
        name="adapters",
        keys=("adapter.kind=lora", "adapter.kind=qlora", "adapter.rank", "adapter.alpha",
              "adapter.dropout", "adapter.targets", "adapter.restrict_to", "adapter.rslora",
              "adapter.dora", "adapter.trainable_modules"),
        stage="model", enabled=_adapters_on,
        plan="only adapter weights (and adapter.trainable_modules) have grads and state",
        apply=_add_adapters, check_applied=_checked(lora.check_applied),
        plan_apply=_add_adapters),
    TechniqueSpec(
        name="quantized base",
        keys=("adapter.kind=qlora", "adapter.quantization", "adapter.double_quant"),
        stage="load", enabled=_qlora,
        plan="techniques.quantize_stand_in: QuantizedLinear's bytes and matmul memory",
        apply=_quantize_base, check_applied=quantize.check_applied,
        plan_apply=_stand_in_for_quantized_base),
    TechniqueSpec(
        name="frozen weights in the compute dtype",
        keys=("adapter.frozen_in_compute_dtype",),
        stage="model", enabled=lambda config: frozen_storage_dtype(config) is not None,
        plan="the meta model's weights are cast as training's",
        apply=_store_frozen_in_compute_dtype, plan_apply=_store_frozen_in_compute_dtype),
    TechniqueSpec(
        name="pure bf16 weights",
        keys=("precision=bf16-pure",),
        stage="device", enabled=lambda config: config.precision is Precision.BF16_PURE,
        plan="plan.meta builds the model in planned_weights_dtype (bfloat16)",
        apply=_cast_to_bf16),
    TechniqueSpec(
        name="mixed precision",
        keys=("precision=bf16", "precision=fp16"),
        stage="step",
        enabled=lambda config: config.precision in (Precision.BF16, Precision.FP16),
        plan="plan.itemize traces the micro-batch under the autocast training.loop runs "
             "forward in (techniques.precision; fp16 adds build's grad scaler)"),
    TechniqueSpec(
        name="chunked loss",
        keys=("memory.chunked_loss", "memory.loss_chunk_tokens"),
        stage="step", enabled=lambda config: config.memory.chunked_loss,
        plan="techniques.training_loss, traced as training runs it (plan.workload)",
        check_applied=_checked(chunked_loss.check_supported)),
    TechniqueSpec(
        name="activation offload",
        keys=("memory.activation_offload",),
        stage="step", enabled=lambda config: config.memory.activation_offload,
        plan="plan.trace counts saved tensors as host bytes, where training.loop's "
             "ActivationOffload context keeps them"),
    TechniqueSpec(
        name="optimizer offload",
        keys=("memory.optimizer_offload",),
        stage="optimizer", enabled=lambda config: config.memory.optimizer_offload,
        plan="plan.itemize counts the state, fp32 master weights and grads and the step's "
             "scratch as host bytes, none of them on the device (on a CPU device too: the "
             "copies are host-tagged storage the tracker counts apart); under FSDP2 its "
             "CPUOffloadPolicy (distributed.fsdp, distributed.host_offload) keeps the "
             "sharded weights, grads and state on the host and steps there",
        apply=_offload_optimizer),
)


def apply_stage(stage: Stage, subject: Any, setting: Setting) -> Any:
    """Training: every enabled technique of ``stage`` applied to ``subject``, in order."""
    for spec in TECHNIQUES:
        if spec.stage == stage and spec.apply is not None and spec.enabled(setting.config):
            subject = spec.apply(subject, setting)
    return subject


def check_applied(model: nn.Module, config: Config) -> list[str]:
    """Training's "did it apply?" checks of every enabled technique, stage by stage;
    returns their warnings (a technique that did not apply raises ConfigError)."""
    warnings = []
    for spec in sorted(TECHNIQUES, key=lambda spec: STAGES.index(spec.stage)):
        if spec.check_applied is not None and spec.enabled(config):
            warnings += spec.check_applied(model)
    return warnings


def plan_apply(model: nn.Module, setting: Setting) -> nn.Module:
    """The planner: every enabled technique's view applied to the meta model, in order."""
    for spec in TECHNIQUES:
        if spec.plan_apply is not None and spec.enabled(setting.config):
            model = spec.plan_apply(model, setting)
    return model
