"""The frozen base's storage: quantized (adapter.kind=qlora) or in the compute dtype.

- QLoRA: ``nn.Linear`` layers become bitsandbytes ``Linear4bit`` (NF4, optionally double
  quantized scales) or ``Linear8bitLt`` (LLM.int8). Hugging Face folders are quantized by
  transformers while loading (``bnb_config``), so full-precision weights never exist all
  at once; built models (presets, factories) are converted here layer by layer.
- Frozen weights in the compute dtype: under bf16/fp16 autocast a Linear computes with
  ``weight.to(bf16)`` anyway, so storing the frozen weight in bf16 gives bit-identical
  results at half the bytes. This replaces ``peft.prepare_model_for_kbit_training``, which
  does the opposite (upcasts every non-quantized weight to fp32, doubling them).
- ``dequantize`` turns bitsandbytes layers back into ``nn.Linear`` (for merging).

The output layer and ``adapter.trainable_modules`` are never quantized (they must stay
exact, and trainable ones need real weights).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from memfit._utils.errors import ConfigError
from memfit.config.schema import AdapterConfig, BaseQuantization, ModelConfig, Precision
from memfit.demo import DEMO_BASE
from memfit.models.gguf import gguf_file

COMPUTE_DTYPES = {Precision.FP32: torch.float32, Precision.BF16: torch.bfloat16,
                  Precision.FP16: torch.float16, Precision.BF16_PURE: torch.bfloat16}
NF4_BLOCK = 64  # weights per absmax scale
DOUBLE_QUANT_BLOCK = 256  # scales per fp32 second-level scale when double quantized
LLM_INT8_THRESHOLD = 6.0  # transformers' default outlier threshold


def compute_dtype(precision: Precision) -> torch.dtype:
    return COMPUTE_DTYPES[precision]


def quantized_while_loading(model: ModelConfig) -> bool:
    """Hugging Face folders (model.path, the demo base) are quantized by transformers while
    loading (``bnb_config``); built models (presets, factories) and GGUF files (which
    transformers dequantizes, and will not combine with bitsandbytes) after, by
    ``quantize_linears``."""
    if model.path:
        return gguf_file(Path(model.path)) is None
    return model.preset == DEMO_BASE


def bnb_config(config: AdapterConfig, precision: Precision, skip_modules: list[str]):
    """transformers' BitsAndBytesConfig for loading a Hugging Face folder quantized.
    ``skip_modules``: names kept unquantized; a list replaces transformers' default (the
    output layer), so that one is added back."""
    from transformers import BitsAndBytesConfig

    if skip_modules:
        skip_modules = [*skip_modules, "lm_head"]

    if config.quantization is BaseQuantization.INT8:
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=LLM_INT8_THRESHOLD,
                                  llm_int8_skip_modules=skip_modules or None)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_use_double_quant=config.double_quant,
                              bnb_4bit_compute_dtype=compute_dtype(precision),
                              llm_int8_skip_modules=skip_modules or None)


def is_quantized_layer(module: nn.Module) -> bool:
    # Where bitsandbytes was never imported, no layer is one of its: asked of every module
    # (FSDP2's make_shardable, merge's dequantize), importing it (~1.5 s) would be wasted.
    bnb = sys.modules.get("bitsandbytes")
    return bnb is not None and isinstance(module, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))


def quantize_linears(model: nn.Module, config: AdapterConfig, precision: Precision,
                     skip: set[str]) -> int:
    """Replace every ``nn.Linear`` not named in ``skip`` (or below it) by a bitsandbytes
    layer, in place, one layer at a time. Returns how many were replaced."""
    replaced = 0
    for name, module in list(model.named_modules()):
        if (type(module) is not nn.Linear or name in skip
                or any(name.startswith(s + ".") for s in skip)):
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _quantized_copy(module, config, compute_dtype(precision)))
        replaced += 1
    return replaced


def _quantized_copy(linear: nn.Linear, config: AdapterConfig, dtype: torch.dtype) -> nn.Module:
    import bitsandbytes as bnb

    has_bias = linear.bias is not None
    device = linear.weight.device
    # Quantize from the compute dtype: dequantized temporaries in forward then have that
    # dtype too (an out x in bf16 matrix per layer instead of fp32).
    weight = linear.weight.detach().to(dtype)
    if config.quantization is BaseQuantization.INT8:
        layer = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=has_bias,
                                    has_fp16_weights=False, threshold=LLM_INT8_THRESHOLD,
                                    device="meta")
        layer.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    else:
        layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=has_bias,
                                  compute_dtype=dtype, compress_statistics=config.double_quant,
                                  quant_type="nf4", device="meta")
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False,
                                         compress_statistics=config.double_quant,
                                         quant_type="nf4", module=layer)
    if has_bias:
        layer.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    # bitsandbytes quantizes when the parameter is moved to a real device.
    return layer.to(device)


def keep_training_layout(model: nn.Module) -> None:
    """Stop bitsandbytes repacking 4-bit weights for its CPU inference kernel the first
    time a layer runs in eval mode without grad (our evaluation): the repacking rewrites
    the weight in place, asserts on layer widths that are not a multiple of its block
    (small models), and would leave training, merging and the checks a different layout."""
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False


def quantized_weight_bytes(out_features: int, in_features: int, config: AdapterConfig) -> int:
    """Bytes a quantized weight (with its scales) occupies: what ``plan`` should count."""
    numel = out_features * in_features
    if config.quantization is BaseQuantization.INT8:
        return numel + 4 * out_features  # int8 codes + one fp32 scale per row
    blocks = -(-numel // NF4_BLOCK)
    codes = -(-numel // 2) + 4 * 16  # two codes a byte + the layer's 16-value fp32 NF4 table
    if not config.double_quant:
        return codes + 4 * blocks  # fp32 absmax per block
    groups = -(-blocks // DOUBLE_QUANT_BLOCK)
    # uint8 absmax codes + fp32 scale per group + their 256-entry fp32 code table + offset
    return codes + blocks + 4 * groups + 4 * 256 + 4


def store_frozen_in(model: nn.Module, dtype: torch.dtype) -> int:
    """Cast frozen weights of plain Linear / Conv layers to ``dtype``; returns bytes saved.

    Tensors shared with other modules (a head tied to the embedding) are left alone: the
    embedding lookup is not autocast, so changing its dtype would change results."""
    layers = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    owners: dict[int, int] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            owners[id(parameter)] = owners.get(id(parameter), 0) + 1
    saved = 0
    for module in model.modules():
        if type(module) not in layers:
            continue
        for parameter in module.parameters(recurse=False):
            if (parameter.requires_grad or owners[id(parameter)] > 1
                    or not parameter.is_floating_point() or parameter.dtype == dtype):
                continue
            before = parameter.nbytes
            parameter.data = parameter.data.to(dtype)
            saved += before - parameter.nbytes
    return saved


def int8_scales(layer: nn.Module) -> torch.Tensor | None:
    """Per-row fp32 scales of a Linear8bitLt: on the weight until the first forward, then
    moved into the layer's matmul state."""
    scales = getattr(layer.weight, "SCB", None)
    return scales if scales is not None else layer.state.SCB


def dequantize(model: nn.Module, dtype: torch.dtype) -> int:
    """Replace bitsandbytes layers by ``nn.Linear`` holding the dequantized weights
    (exactly the values the quantized layer computed with). Returns how many."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnb_functional

    count = 0
    for name, module in list(model.named_modules()):
        if not is_quantized_layer(module):
            continue
        weight = module.weight
        if isinstance(module, bnb.nn.Linear4bit):
            values = bnb_functional.dequantize_4bit(weight.data, weight.quant_state)
        else:
            values = bnb_functional.int8_vectorwise_dequant(weight.data, int8_scales(module))
        linear = nn.Linear(module.in_features, module.out_features,
                           bias=module.bias is not None, device="meta")
        linear.weight = nn.Parameter(values.to(dtype), requires_grad=False)
        if module.bias is not None:
            linear.bias = nn.Parameter(module.bias.detach().to(dtype), requires_grad=False)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, linear)
        count += 1
    return count


def check_applied(model: nn.Module) -> list[str]:
    """Raise unless quantized layers really hold quantized data; return warnings naming
    frozen weights left in full precision (3-D expert weights are the usual case:
    bitsandbytes quantizes nn.Linear layers only)."""
    import bitsandbytes as bnb

    quantized = 0
    inside_quantized: set[int] = set()
    for name, module in model.named_modules():
        if not is_quantized_layer(module):
            continue
        weight = module.weight
        if isinstance(module, bnb.nn.Linear4bit):
            ok = (getattr(weight, "bnb_quantized", False) and weight.quant_state is not None
                  and not weight.is_floating_point())
        else:
            ok = weight.dtype == torch.int8 and int8_scales(module) is not None
        if not ok:
            raise ConfigError(f"adapter.kind=qlora: layer {name} was replaced but holds "
                              f"{weight.dtype} data, not quantized codes")
        quantized += 1
        inside_quantized.update(id(p) for p in module.parameters())
    if quantized == 0:
        raise ConfigError("adapter.kind=qlora: no layer was quantized (bitsandbytes replaces "
                          "nn.Linear layers; this model has none outside the kept ones)")
    left = [(name, p) for name, p in model.named_parameters()
            if not p.requires_grad and p.ndim >= 2 and id(p) not in inside_quantized
            and p.is_floating_point()]
    experts = [(name, p) for name, p in left if p.ndim >= 3]
    if not experts:
        return []
    mib = sum(p.nbytes for _, p in experts) / 2**20
    return [f"adapter.kind=qlora: {len(experts)} weights with 3 or more dimensions "
            f"({mib:.1f} MiB, e.g. {experts[0][0]}) stay in {experts[0][1].dtype}: "
            "bitsandbytes quantizes nn.Linear layers only"]
