"""How each peer tool builds what it trains, written the way its documentation shows: the
model loaded from a Hugging Face folder and its optimizer. ``memfit bench``'s peer loops
(bench.peers) and the benchmarks/ scripts build their peers here.

A peer reads its numbers (learning rate, betas, precision, LoRA rank, GaLore rank ...) from
the ``Recipe`` of a memfit config — the one of the memfit case it mirrors, so a pair
differs only in the tool; a script that wants a library's own defaults sets them in that
config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memfit.config.schema import Config, GaloreConfig, OptimizerConfig, Precision
from memfit.techniques.optimizers.options import adam_options
from memfit.techniques.optimizers.registry import spec_for
from memfit.techniques.technique_options import TechniqueOptions

# GaLore projects the attention and MLP matrices (the GaLore README's target modules).
GALORE_TARGETS = ("attn", "mlp")


@dataclass(frozen=True)
class Recipe:
    """What a peer takes of the memfit case it mirrors: optimizer.* and the techniques
    (adapter.*, precision, memory.gradient_checkpointing)."""

    optimizer: OptimizerConfig
    techniques: TechniqueOptions

    @classmethod
    def of(cls, config: Config) -> Recipe:
        return cls(config.optimizer, TechniqueOptions.of(config))


@dataclass
class ModelAndOptimizer:
    model: nn.Module
    # None: per-parameter optimizers stepped by post-accumulate-grad hooks inside backward.
    optimizer: torch.optim.Optimizer | None


def load_model(folder: Path, device: torch.device) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).to(device)


def _adam_arguments(optimizer: OptimizerConfig) -> dict[str, Any]:
    # weight_decay given explicitly: torch's and bitsandbytes' defaults are 0.01, memfit's 0.
    return {**adam_options(optimizer, spec_for(optimizer).options),
            "weight_decay": optimizer.weight_decay}


def torch_adamw(folder: Path, recipe: Recipe, device: torch.device) -> ModelAndOptimizer:
    model = load_model(folder, device)
    optimizer = torch.optim.AdamW(model.parameters(), **_adam_arguments(recipe.optimizer))
    return ModelAndOptimizer(model, optimizer)


def bnb_adamw8bit(folder: Path, recipe: Recipe, device: torch.device) -> ModelAndOptimizer:
    import bitsandbytes as bnb

    model = load_model(folder, device)
    optimizer = bnb.optim.AdamW8bit(model.parameters(), **_adam_arguments(recipe.optimizer))
    return ModelAndOptimizer(model, optimizer)


def torch_adafactor(folder: Path, recipe: Recipe, device: torch.device) -> ModelAndOptimizer:
    model = load_model(folder, device)
    optimizer = torch.optim.Adafactor(model.parameters(), lr=recipe.optimizer.lr)
    return ModelAndOptimizer(model, optimizer)


def peft_lora(folder: Path, recipe: Recipe, device: torch.device) -> ModelAndOptimizer:
    """PEFT's recipe: (4-bit load + prepare_model_for_kbit_training for QLoRA),
    non-reentrant checkpointing when asked, get_peft_model, AdamW on what trains."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    adapter = recipe.techniques.adapter
    checkpointing = recipe.techniques.memory.gradient_checkpointing
    kwargs = {"use_reentrant": False}
    if adapter.kind.value == "qlora":
        bf16 = recipe.techniques.precision is Precision.BF16
        compute = torch.bfloat16 if bf16 else torch.float32
        quantization = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=adapter.double_quant, bnb_4bit_compute_dtype=compute)
        # bitsandbytes quantizes while loading: place the layers on the GPU from the start.
        placement = ({"device_map": {"": torch.cuda.current_device()}}
                     if device.type == "cuda" else {})
        model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=quantization,
                                                     **placement)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing,
                                                gradient_checkpointing_kwargs=kwargs)
    else:
        model = load_model(folder, device)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model = get_peft_model(model, LoraConfig(r=adapter.rank, lora_alpha=adapter.alpha,
                                             lora_dropout=adapter.dropout,
                                             target_modules="all-linear"))
    model.to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, **_adam_arguments(recipe.optimizer))
    return ModelAndOptimizer(model, optimizer)


def _galore_groups(model: nn.Module) -> tuple[list, list]:
    """(other parameters, projected linear weights) as the GaLore README selects them."""
    projected = [module.weight for name, module in model.named_modules()
                 if isinstance(module, nn.Linear) and any(t in name for t in GALORE_TARGETS)]
    ids = {id(p) for p in projected}
    return [p for p in model.parameters() if id(p) not in ids], projected


def galore_settings(galore: GaloreConfig) -> dict[str, Any]:
    """galore-torch's parameter-group options for ``optimizer.galore``."""
    return {"rank": galore.rank, "update_proj_gap": galore.update_gap, "scale": galore.scale,
            "proj_type": "std"}


def galore_torch(folder: Path, recipe: Recipe, device: torch.device) -> ModelAndOptimizer:
    from galore_torch import GaLoreAdamW

    model = load_model(folder, device)
    other, projected = _galore_groups(model)
    optimizer = GaLoreAdamW([{"params": other},
                             {"params": projected, **galore_settings(recipe.optimizer.galore)}],
                            **_adam_arguments(recipe.optimizer))
    return ModelAndOptimizer(model, optimizer)


def _galore_per_layer(make: Callable[..., torch.optim.Optimizer], folder: Path,
                      recipe: Recipe, device: torch.device) -> ModelAndOptimizer:
    """The GaLore README's per-layer recipe: one optimizer per parameter, stepped by a
    post-accumulate-grad hook (so it steps on every backward; fine without accumulation)."""
    model = load_model(folder, device)
    other, projected = _galore_groups(model)
    arguments = _adam_arguments(recipe.optimizer)
    per_parameter = {p: make([{"params": [p]}], **arguments) for p in other}
    galore = galore_settings(recipe.optimizer.galore)
    per_parameter.update({p: make([{"params": [p], **galore}], **arguments)
                          for p in projected})

    def step_parameter(parameter: torch.Tensor) -> None:
        per_parameter[parameter].step()
        per_parameter[parameter].zero_grad(set_to_none=True)

    for parameter in per_parameter:
        parameter.register_post_accumulate_grad_hook(step_parameter)
    return ModelAndOptimizer(model, None)


def galore_torch_layerwise(folder: Path, recipe: Recipe, device: torch.device) -> ModelAndOptimizer:
    from galore_torch import GaLoreAdamW

    return _galore_per_layer(GaLoreAdamW, folder, recipe, device)


def galore_torch_8bit_layerwise(folder: Path, recipe: Recipe,
                                device: torch.device) -> ModelAndOptimizer:
    from galore_torch import GaLoreAdamW8bit

    return _galore_per_layer(GaLoreAdamW8bit, folder, recipe, device)


BUILDERS: dict[str, Callable[[Path, Recipe, torch.device], ModelAndOptimizer]] = {
    "torch-adamw": torch_adamw,
    "bnb-adamw8bit": bnb_adamw8bit,
    "torch-adafactor": torch_adafactor,
    "peft": peft_lora,
    "galore-torch": galore_torch,
    "galore-torch-layerwise": galore_torch_layerwise,
    "galore-torch-8bit-layerwise": galore_torch_8bit_layerwise,
}
