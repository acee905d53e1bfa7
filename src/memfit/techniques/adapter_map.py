"""The adapter map: after LoRA is applied, which modules got adapters, grouped by pattern
(numbered path components shown as ``*``: ``model.layers.*.self_attn.q_proj``), the
trainable parameters of each group (adapter weights; modules trained in full, such as
``adapter.trainable_modules`` or a new head) and how many parameters stay frozen.

A fused attention projection (``qkv``, ``c_attn``, nn.MultiheadAttention, ...) computes
q, k and v at once. Under the part kinds (``attention-qv``, ``attention-q`` ...) memfit
places updates on the named parts' rows only, and the map names those parts; where the
layout is unknown (GPT-NeoX's per-head interleaved ``query_key_value``) one adapter changes
all three: the map says so for each such group, and ``adapter_map`` warns.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

from torch import nn

from memfit._utils.errors import MemfitWarning
from memfit.config.schema import AdapterConfig
from memfit.techniques.lora import FUSED_QKV, placed_parts

# PEFT's names: adapter weights (lora_A, lora_B, DoRA's lora_magnitude_vector) under the
# adapted module, and the trained copy of a module it trains in full.
_ADAPTER_PART = ".lora_"
_FULL_COPY_PART = ".modules_to_save."


@dataclass(frozen=True)
class AdaptedGroup:
    pattern: str  # e.g. "model.layers.*.self_attn.q_proj"
    modules: int
    parameters: int  # adapter parameters of all its modules
    fused_qkv: bool  # a q,k,v projection in one Linear: all three adapted
    parts: tuple[str, ...] = ()  # a fused projection's parts that got updates, e.g. q, v


@dataclass(frozen=True)
class TrainedGroup:
    pattern: str  # a module trained in full, e.g. "classifier"
    parameters: int


@dataclass(frozen=True)
class AdapterMap:
    targets: tuple[str, ...]  # adapter.targets as configured
    adapted: tuple[AdaptedGroup, ...]  # in model order
    trained_in_full: tuple[TrainedGroup, ...]
    frozen_parameters: int

    @property
    def trainable_parameters(self) -> int:
        return (sum(group.parameters for group in self.adapted)
                + sum(group.parameters for group in self.trained_in_full))

    def to_text(self) -> str:
        modules = sum(group.modules for group in self.adapted)
        lines = [f"adapters on {modules} modules (adapter.targets="
                 f"{','.join(self.targets)}):"]
        for group in self.adapted:
            fused = ("; q,k,v fused: all three adapted" if group.fused_qkv
                     else f"; parts {','.join(group.parts)} only" if group.parts else "")
            lines.append(f"  {group.pattern}: {group.modules} modules, "
                         f"{group.parameters:,} adapter parameters{fused}")
        for group in self.trained_in_full:
            lines.append(f"  {group.pattern}: trained in full, {group.parameters:,} parameters")
        lines.append(f"  trainable {self.trainable_parameters:,} parameters, frozen "
                     f"{self.frozen_parameters:,}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"targets": list(self.targets),
                "adapted": [vars(group) for group in self.adapted],
                "trained_in_full": [vars(group) for group in self.trained_in_full],
                "trainable_parameters": self.trainable_parameters,
                "frozen_parameters": self.frozen_parameters}


def adapter_map(model: nn.Module, config: AdapterConfig) -> AdapterMap:
    """The map of ``model`` as ``techniques.lora.apply`` returned it; warns (one line)
    when ``attention-qv`` adapted fused q,k,v projections whole."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    adapted: dict[str, dict[str, int]] = {}  # pattern -> module name -> adapter parameters
    trained: dict[str, int] = {}
    frozen = 0
    for name, parameter in base.named_parameters():
        count = original_numel(parameter)
        if not parameter.requires_grad:
            frozen += count
        elif _ADAPTER_PART in name:
            module = name.split(_ADAPTER_PART, 1)[0]
            by_module = adapted.setdefault(_pattern(module), {})
            by_module[module] = by_module.get(module, 0) + count
        else:
            module = (name.split(_FULL_COPY_PART, 1)[0] if _FULL_COPY_PART in name
                      else name.rpartition(".")[0] or name)
            trained[_pattern(module)] = trained.get(_pattern(module), 0) + count
    parts = {_pattern(name): tuple(rows) for name, rows in placed_parts(model).items()}
    groups = tuple(AdaptedGroup(pattern, len(by_module), sum(by_module.values()),
                                pattern.rsplit(".", 1)[-1] in FUSED_QKV and pattern not in parts,
                                parts.get(pattern, ()))
                   for pattern, by_module in adapted.items())
    fused = [group.pattern for group in groups if group.fused_qkv]
    if fused and "attention-qv" in config.targets:
        warnings.warn(f"adapter.targets=attention-qv adapted fused q,k,v projections "
                      f"({', '.join(fused)}) whole (their rows are not laid out as q, k, v "
                      "blocks): their adapters change k as well as q and v; "
                      "leave them out with adapter.restrict_to or name them in "
                      "adapter.targets to adapt them knowingly", MemfitWarning,
                      stacklevel=2)
    return AdapterMap(tuple(config.targets), groups,
                      tuple(TrainedGroup(pattern, count) for pattern, count in trained.items()),
                      frozen)


def _pattern(module_name: str) -> str:
    """Numbered path components (blocks of a ModuleList) as ``*``."""
    return ".".join("*" if part.isdigit() else part for part in module_name.split("."))


def original_numel(parameter: nn.Parameter) -> int:
    """Elements before quantization: a bitsandbytes 4-bit weight packs two per byte and
    keeps the original shape in its quant_state."""
    quant_state = getattr(parameter, "quant_state", None)
    if quant_state is not None:
        return math.prod(quant_state.shape)
    return parameter.numel()


def original_parameter_count(model: nn.Module) -> int:
    """Parameters as the model had them before any 4-bit packing."""
    return sum(original_numel(parameter) for parameter in model.parameters())
