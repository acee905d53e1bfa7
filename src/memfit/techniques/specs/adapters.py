"""LoRA / DoRA adapters (adapter.kind=lora or qlora): techniques/lora.py."""

from __future__ import annotations

from torch import nn

from memfit.config.choices import CLASSIFYING_TASKS
from memfit.config.schema import AdapterKind, Task
from memfit.models.classifier import head_names
from memfit.techniques import lora
from memfit.techniques.precision import AUTOCAST_DTYPES
from memfit.techniques.specs.spec import Setting, TechniqueOptions, TechniqueSpec


def enabled(options: TechniqueOptions) -> bool:
    return options.adapter.kind is not AdapterKind.NONE


def apply(model: nn.Module, setting: Setting) -> nn.Module:
    task = setting.options.model.task
    return lora.apply(model, setting.options.adapter,
                      classifier_head=head_names(model) if task in CLASSIFYING_TASKS else (),
                      sequence_classifier=task is Task.SEQUENCE_CLASSIFICATION,
                      autocast=setting.options.precision in AUTOCAST_DTYPES)


def check_applied(model: nn.Module, options: TechniqueOptions) -> list[str]:
    lora.check_applied(model)
    return []


SPEC = TechniqueSpec(
    name="adapters",
    docs_row=("LoRA / DoRA / rsLoRA through PEFT; `adapter.targets` takes names, globs, "
              "classes, or kinds: `attention-qv`, `attention-q`/`-k`/`-v` (on fused `qkv`, "
              "`c_attn`, `qkv_proj`, `nn.MultiheadAttention`: only those rows), `attention`, "
              "`mlp`, `all-linear`, `conv`; Linear / Conv subclasses keep their own forward"),
    keys=("adapter.kind=lora", "adapter.kind=qlora", "adapter.rank", "adapter.alpha",
          "adapter.dropout", "adapter.targets", "adapter.restrict_to", "adapter.rslora",
          "adapter.dora", "adapter.trainable_modules"),
    stage="model", enabled=enabled,
    plan="only adapter weights (and adapter.trainable_modules) have grads and state",
    apply=apply, check_applied=check_applied, plan_apply=apply,
    plan_methods=(("lora", {"adapter.kind": "lora"}), ("qlora", {"adapter.kind": "qlora"})))
