"""The model of a Config on the ``meta`` device, with the config's techniques applied.

Built from the same sources as training (an HF ``config.json``, a preset, a factory) and
through the same technique functions (LoRA, frozen weights in the compute dtype,
checkpointing), so parameter shapes, dtypes and which ones train are the real ones;
nothing is allocated. A 4-bit base cannot be quantized without data, so QLoRA's
bitsandbytes layers are stood in for by ``QuantizedLinear``: the same bytes (from
``techniques.quantize.quantized_weight_bytes``) and the same forward/backward memory
(a dequantized weight exists only inside each matmul; only the quantized data is kept;
the output in the input's dtype, as bitsandbytes returns it).

A factory runs under the meta device with ``from_pretrained`` building from the folder's
``config.json`` (``plan.pretrained_on_meta``), so wrapping a pretrained model plans too.

Hugging Face models can be built with fewer layers (``layers=``) so the planner can trace
activations of a 70B model in seconds and extrapolate per layer.

A sequence classifier gets the head training would give it: the classes of
``models.classifier.with_classes`` when data.path is set (else model.labels,
model.num_labels, or the folder's own config), trained in full beside adapters.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from memfit._utils.errors import ModelError
from memfit.config.schema import AdapterKind, BaseQuantization, Config, Precision, Task
from memfit.models.classifier import head_names, label_arguments, with_classes
from memfit.models.load import TORCH_DTYPES, build_image_preset, import_object
from memfit.models.presets import DEMO_BASE, IMAGE_PRESETS, PRESETS, preset_names
from memfit.plan.pretrained_on_meta import from_pretrained_on_meta
from memfit.techniques import checkpointing, lora, quantize

# The bitsandbytes autograd function a quantized Linear trains through (QuantizedLinear).
QuantizedPath = Literal["matmul4bit", "matmul8bitlt", "matmul8bitfp"]


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


def build(config: Config, layers: int | None = None, device: str = "cuda") -> MetaModel:
    """The model as training would build it, on meta; ``layers`` shortens an HF model;
    ``device`` (cuda, cpu) picks the bitsandbytes code path a quantized base would take."""
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
        if config.model.task is Task.SEQUENCE_CLASSIFICATION:
            base_config = _with_classes(base_config, config)
        model, is_transformers = _from_hf_config(base_config, config.model.task), True
        depth_used = depth(base_config)
    model.to(dtype)
    model = _apply_techniques(model, config, is_transformers, device)
    return MetaModel(model, is_transformers, depth_used)


def _with_layers(transformers_config, layers: int | None):
    if layers is None:
        return transformers_config
    shorter = copy.deepcopy(transformers_config)
    shorter.num_hidden_layers = layers
    if getattr(shorter, "layer_types", None):  # per-layer attention kinds (Gemma-2, Qwen2)
        shorter.layer_types = list(shorter.layer_types)[:layers]
    return shorter


def _with_classes(transformers_config, config: Config):
    """The transformers config of a sequence classifier with the classes it will train."""
    if config.data.path is not None:
        config = with_classes(config)
    labels = config.model.labels or tuple(
        f"LABEL_{index}" for index in range(config.model.num_labels
                                            or transformers_config.num_labels))
    shaped = copy.deepcopy(transformers_config)
    for key, value in label_arguments(labels).items():
        setattr(shaped, key, value)
    if shaped.pad_token_id is None:  # decoder classifiers refuse batches without one
        shaped.pad_token_id = 0
    return shaped


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
        with torch.device("meta"), from_pretrained_on_meta():
            model = factory()
    except Exception as error:  # noqa: BLE001  (the user's code failed; say where)
        raise ModelError(f"model.factory={config.model.factory!r} raised {error!r} while "
                         "being built on the meta device") from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"model.factory={config.model.factory!r} returned "
                         f"{type(model).__name__}, not an nn.Module")
    return model


def _apply_techniques(model: nn.Module, config: Config, is_transformers: bool,
                      device: str) -> nn.Module:
    """training.build's order: checkpointing, LoRA, (4-bit base), frozen weights in the
    compute dtype. The 4-bit stand-in comes after LoRA here (PEFT wraps nn.Linear; the
    real build quantizes first and PEFT wraps bitsandbytes layers): the same result."""
    adapter = config.adapter
    head = _output_layer(model)
    if config.memory.gradient_checkpointing:
        model = checkpointing.apply(model, config.memory, is_transformers)
    if adapter.kind is not AdapterKind.NONE:
        classifier_head = (head_names(model) if config.model.task is Task.SEQUENCE_CLASSIFICATION
                           else ())
        model = lora.apply(model, adapter, classifier_head=classifier_head)
        if adapter.kind is AdapterKind.QLORA:
            _quantize_frozen_linears(model, config, head, quantized_path(config, device))
        if adapter.frozen_in_compute_dtype and config.precision in (Precision.BF16,
                                                                     Precision.FP16):
            quantize.store_frozen_in(model, quantize.compute_dtype(config.precision))
    return model


def _output_layer(model: nn.Module) -> nn.Module | None:
    get_head = getattr(model, "get_output_embeddings", None)
    return get_head() if callable(get_head) else None


def quantized_path(config: Config, device: str) -> QuantizedPath:
    """The bitsandbytes autograd function a quantized base trains through on ``device``:
    MatMul4Bit for NF4; for int8, MatMul8bitLt on CUDA and MatMul8bitFp on CPU."""
    if config.adapter.quantization is not BaseQuantization.INT8:
        return "matmul4bit"
    return "matmul8bitfp" if device == "cpu" else "matmul8bitlt"


def _quantized_from(config: Config) -> torch.dtype:
    """The dtype the 4-bit weights were quantized from, which is the dtype bitsandbytes
    dequantizes them to in backward: Hugging Face folders are quantized by transformers
    while loading in model.dtype; built models (presets, factories) by
    techniques.quantize from the compute dtype (as training.build.load_base decides)."""
    if config.model.path or config.model.preset == DEMO_BASE:
        return TORCH_DTYPES[config.model.dtype]
    return quantize.compute_dtype(config.precision)


def _quantize_frozen_linears(model: nn.Module, config: Config, skip: nn.Module | None,
                             path: QuantizedPath) -> None:
    """Every frozen plain nn.Linear but the output layer becomes a QuantizedLinear."""
    compute, source = quantize.compute_dtype(config.precision), _quantized_from(config)
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Linear or module is skip or module.weight.requires_grad:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        nbytes = quantize.quantized_weight_bytes(module.out_features, module.in_features,
                                                 config.adapter)
        setattr(parent, child, QuantizedLinear(module, nbytes, compute, source, path))


class QuantizedLinear(nn.Module):
    """Planning stand-in for a bitsandbytes Linear4bit (NF4) or Linear8bitLt (int8):
    ``quantized`` holds its bytes; forward and backward allocate what bitsandbytes'
    ``path`` does (the functions below, one per bitsandbytes autograd function).

    The output is in the input's dtype, not the autocast dtype, except on MatMul8bitFp:
    Linear4bit casts x to the compute dtype for the matmul and the result back to x's
    dtype; MatMul8bitLt computes in x's dtype. Under bf16 autocast with an fp32 residual
    stream, an fp32 input (an RMSNorm output, the SiLU(gate) * up product) thus gives an
    fp32 output where a plain Linear gives bf16, and the element-wise ops after it (RoPE,
    SiLU, the product, the LoRA sum) save fp32 activations."""

    def __init__(self, linear: nn.Linear, nbytes: int, compute_dtype: torch.dtype,
                 quantized_from: torch.dtype, path: QuantizedPath) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.compute_dtype, self.quantized_from, self.path = compute_dtype, quantized_from, path
        self.register_buffer("quantized", torch.empty(nbytes, dtype=torch.uint8,
                                                      device=linear.weight.device))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (self.out_features, self.in_features)
        if self.path == "matmul4bit":
            out = _MatMul4Bit.apply(x.to(self.compute_dtype), self.quantized, shape,
                                    self.quantized_from)
        else:
            function = _MatMul8bitLt if self.path == "matmul8bitlt" else _MatMul8bitFp
            out = function.apply(x, self.quantized, shape)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.to(x.dtype) if self.path == "matmul4bit" else out


class _MatMul4Bit(torch.autograd.Function):
    """x [..., in] (compute dtype) @ W^T, W [out, in]. Forward: W dequantized to x's dtype
    for the matmul only (CUDA's path past a few rows of x; on CPU it happens inside one
    bitsandbytes op, unseen by the tracker: the CPU plan counts it in excess). Only the 4-bit
    data is kept. Backward: W dequantized to the dtype it was quantized from, then cast to
    the gradient's dtype (two copies when those differ)."""

    @staticmethod
    def forward(ctx, x, quantized, shape, quantized_from):  # noqa: ANN001
        ctx.shape, ctx.quantized_from = shape, quantized_from
        return x @ torch.empty(shape, dtype=x.dtype, device=x.device).t()

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001
        # dequantize_4bit(...).to(grad.dtype): the first copy is gone before the matmul.
        weight = torch.empty(ctx.shape, dtype=ctx.quantized_from, device=grad.device)
        weight = weight.to(grad.dtype)
        return grad @ weight, None, None, None


class _MatMul8bitLt(torch.autograd.Function):
    """CUDA int8: x [M, in] in fp16 to quantize it to int8 codes, the int8 matmul gives
    [..., out] in x's dtype; x itself is kept on ctx (outside autograd's saved tensors, so
    it counts as a temporary). Backward: W dequantized to x's dtype and the gradient cast
    to it (MatMul8bitLt.backward)."""

    @staticmethod
    def forward(ctx, x, quantized, shape):  # noqa: ANN001
        ctx.shape, ctx.kept = shape, x
        half = x.to(torch.float16)  # what int8_vectorwise_quant quantizes
        codes = torch.empty(half.shape, dtype=torch.int8, device=x.device)
        del half
        # int8_scaled_mm(codes, W codes): the output; the codes die when forward returns.
        out = torch.empty((*x.shape[:-1], shape[0]), dtype=x.dtype, device=x.device)
        del codes
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001
        # ctx.kept lives until autograd releases this node, after backward returns.
        weight = torch.empty(ctx.shape, dtype=ctx.kept.dtype, device=grad.device)
        return grad.to(ctx.kept.dtype) @ weight, None, None


class _MatMul8bitFp(_MatMul8bitLt):
    """CPU int8: W dequantized to x's dtype, F.linear under autocast (so the output is in
    the autocast dtype); x kept on ctx. Backward as MatMul8bitLt's."""

    @staticmethod
    def forward(ctx, x, quantized, shape):  # noqa: ANN001
        ctx.shape, ctx.kept = shape, x
        return torch.nn.functional.linear(x, torch.empty(shape, dtype=x.dtype, device=x.device))
