"""The model of a Config on the ``meta`` device, with the config's techniques applied.

Built from the same sources as training (an HF ``config.json``, a preset, a factory) and
through the same technique functions (LoRA, frozen weights in the compute dtype,
checkpointing), so parameter shapes, dtypes and which ones train are the real ones;
nothing is allocated. A 4-bit base cannot be quantized without data, so QLoRA's
bitsandbytes layers are stood in for by ``Nf4Linear``: the same bytes (from
``techniques.quantize.quantized_weight_bytes``) and the same forward/backward memory
(a dequantized weight exists only inside each matmul; only the 4-bit data is kept).

Hugging Face models can be built with fewer layers (``layers=``) so the planner can trace
activations of a 70B model in seconds and extrapolate per layer.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from memfit._utils.errors import ModelError
from memfit.config.schema import AdapterKind, Config, Precision, Task
from memfit.models.load import TORCH_DTYPES, build_image_preset, import_object
from memfit.models.presets import DEMO_BASE, IMAGE_PRESETS, PRESETS, preset_names
from memfit.techniques import checkpointing, lora, quantize


@dataclass
class MetaModel:
    model: nn.Module
    is_transformers: bool
    layers: int | None  # depth of the repeated block stack of an HF model; None: factory


def hf_config(config: Config):
    """The transformers config of model.path / model.preset, or None for a factory."""
    from transformers import AutoConfig

    model = config.model
    if model.preset in IMAGE_PRESETS:
        return None  # a plain nn.Module preset, built like a factory model
    if model.preset:
        if model.preset == DEMO_BASE:
            from memfit.demo import demo_assets_dir

            return AutoConfig.from_pretrained(demo_assets_dir() / "base")
        if model.preset not in PRESETS:
            raise ModelError(f"model.preset={model.preset!r} is not one of: "
                             f"{', '.join(preset_names())}")
        return PRESETS[model.preset]()
    if model.path:
        folder = Path(model.path)
        if not (folder / "config.json").is_file():
            raise ModelError(f"model.path={folder} is not a Hugging Face model folder "
                             "(no config.json)")
        return AutoConfig.from_pretrained(folder)
    return None


def depth(transformers_config) -> int:
    return int(transformers_config.num_hidden_layers)


def build(config: Config, layers: int | None = None) -> MetaModel:
    """The model as training would build it, on meta; ``layers`` shortens an HF model."""
    dtype = TORCH_DTYPES[config.model.dtype]
    if config.precision is Precision.BF16_PURE:
        dtype = torch.bfloat16
    base_config = hf_config(config)
    if base_config is None and config.model.preset in IMAGE_PRESETS:
        with torch.device("meta"):
            model = build_image_preset(config.model, config.data.images)
        is_transformers, depth_used = False, None
    elif base_config is None:
        model, is_transformers, depth_used = _from_factory(config), False, None
    else:
        base_config = _with_layers(base_config, layers)
        model, is_transformers = _from_hf_config(base_config, config.model.task), True
        depth_used = depth(base_config)
    model.to(dtype)
    model = _apply_techniques(model, config, is_transformers)
    return MetaModel(model, is_transformers, depth_used)


def _with_layers(transformers_config, layers: int | None):
    if layers is None:
        return transformers_config
    shorter = copy.deepcopy(transformers_config)
    shorter.num_hidden_layers = layers
    if getattr(shorter, "layer_types", None):  # per-layer attention kinds (Gemma-2, Qwen2)
        shorter.layer_types = list(shorter.layer_types)[:layers]
    return shorter


def _from_hf_config(transformers_config, task: Task) -> nn.Module:
    import transformers

    classes = {Task.CAUSAL_LM: transformers.AutoModelForCausalLM,
               Task.SEQUENCE_CLASSIFICATION: transformers.AutoModelForSequenceClassification}
    if task not in classes:
        raise ModelError(f"model.task={task} needs model.factory")
    with torch.device("meta"):
        return classes[task].from_config(transformers_config)


def _from_factory(config: Config) -> nn.Module:
    factory = import_object(config.model.factory, "model.factory")
    try:
        with torch.device("meta"):
            model = factory()
    except Exception as error:  # noqa: BLE001  (the user's code failed; say where)
        raise ModelError(f"model.factory={config.model.factory!r} raised {error!r} while "
                         "being built on the meta device") from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"model.factory={config.model.factory!r} returned "
                         f"{type(model).__name__}, not an nn.Module")
    return model


def _apply_techniques(model: nn.Module, config: Config, is_transformers: bool) -> nn.Module:
    """training.build's order: checkpointing, LoRA, (4-bit base), frozen weights in the
    compute dtype. The 4-bit stand-in comes after LoRA here (PEFT wraps nn.Linear; the
    real build quantizes first and PEFT wraps bitsandbytes layers): the same result."""
    adapter = config.adapter
    head = _output_layer(model)
    if config.memory.gradient_checkpointing:
        model = checkpointing.apply(model, config.memory, is_transformers)
    if adapter.kind is not AdapterKind.NONE:
        model = lora.apply(model, adapter)
        if adapter.kind is AdapterKind.QLORA:
            _quantize_frozen_linears(model, config, skip=head)
        if adapter.frozen_in_compute_dtype and config.precision in (Precision.BF16,
                                                                     Precision.FP16):
            quantize.store_frozen_in(model, quantize.compute_dtype(config.precision))
    return model


def _output_layer(model: nn.Module) -> nn.Module | None:
    get_head = getattr(model, "get_output_embeddings", None)
    return get_head() if callable(get_head) else None


def _quantize_frozen_linears(model: nn.Module, config: Config, skip: nn.Module | None) -> None:
    """Every frozen plain nn.Linear but the output layer becomes an Nf4Linear."""
    compute = quantize.compute_dtype(config.precision)
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Linear or module is skip or module.weight.requires_grad:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        nbytes = quantize.quantized_weight_bytes(module.out_features, module.in_features,
                                                 config.adapter)
        setattr(parent, child, Nf4Linear(module, nbytes, compute))


class Nf4Linear(nn.Module):
    """Planning stand-in for a bitsandbytes 4-bit Linear: ``quantized`` holds its bytes."""

    def __init__(self, linear: nn.Linear, nbytes: int, compute_dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.compute_dtype = compute_dtype
        self.register_buffer("quantized", torch.empty(nbytes, dtype=torch.uint8,
                                                      device=linear.weight.device))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _DequantizedMatmul.apply(x, self.quantized, self.out_features, self.in_features,
                                       self.compute_dtype)
        return out if self.bias is None else out + self.bias.to(out.dtype)


class _DequantizedMatmul(torch.autograd.Function):
    """y = x W^T with W [out, in] dequantized for the matmul only, in forward and again in
    backward (bitsandbytes' MatMul4Bit keeps only the 4-bit data for backward)."""

    @staticmethod
    def forward(ctx, x, quantized, out_features, in_features, dtype):  # noqa: ANN001
        ctx.shape, ctx.dtype = (out_features, in_features), dtype
        weight = torch.empty(out_features, in_features, dtype=dtype, device=x.device)
        return x @ weight.to(x.dtype).t()

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001
        weight = torch.empty(ctx.shape, dtype=ctx.dtype, device=grad.device)
        return grad @ weight.to(grad.dtype), None, None, None, None
