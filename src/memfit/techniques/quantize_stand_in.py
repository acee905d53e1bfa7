"""The planner's stand-in for a quantized base (adapter.kind=qlora): a 4-bit base cannot be
quantized on the meta device (bitsandbytes quantizes real data), so ``QuantizedLinear``
takes each frozen Linear's place with the same bytes (``quantize.quantized_weight_bytes``)
and the same forward/backward memory as the bitsandbytes layer: a dequantized weight
exists only inside each matmul; only the quantized data is kept; the output is in the
input's dtype, as bitsandbytes returns it.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from memfit.config.schema import AdapterConfig, BaseQuantization, ModelConfig, Precision
from memfit.models.load import TORCH_DTYPES
from memfit.techniques import quantize
from memfit.techniques.technique_options import TechniqueOptions

# The bitsandbytes autograd function a quantized Linear trains through (QuantizedLinear).
QuantizedPath = Literal["matmul4bit", "matmul8bitlt", "matmul8bitfp"]


def quantized_path(adapter: AdapterConfig, device: str) -> QuantizedPath:
    """The bitsandbytes autograd function a quantized base trains through on ``device``:
    MatMul4Bit for NF4; for int8, MatMul8bitLt on CUDA and MatMul8bitFp on CPU."""
    if adapter.quantization is not BaseQuantization.INT8:
        return "matmul4bit"
    return "matmul8bitfp" if device == "cpu" else "matmul8bitlt"


def _quantized_from(model: ModelConfig, precision: Precision) -> torch.dtype:
    """The dtype the 4-bit weights were quantized from, which is the dtype bitsandbytes
    dequantizes them to in backward: Hugging Face folders are quantized by transformers
    while loading in model.dtype; built models (presets, factories) by
    techniques.quantize from the compute dtype."""
    if quantize.quantized_while_loading(model):
        return TORCH_DTYPES[model.dtype]
    return quantize.compute_dtype(precision)


def stand_in_for_frozen_linears(model: nn.Module, options: TechniqueOptions,
                                skip: nn.Module | None, path: QuantizedPath) -> None:
    """Every frozen plain nn.Linear but ``skip`` (the output layer) becomes a
    QuantizedLinear. Called after the adapters: PEFT wraps plain nn.Linear layers, and the
    stand-in then replaces the frozen base layer inside each wrapper."""
    compute = quantize.compute_dtype(options.precision)
    source = _quantized_from(options.model, options.precision)
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Linear or module is skip or module.weight.requires_grad:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        nbytes = quantize.quantized_weight_bytes(module.out_features, module.in_features,
                                                 options.adapter)
        setattr(parent, child, QuantizedLinear(module, nbytes, compute, source, path))


def quantizing_bytes(model: nn.Module, options: TechniqueOptions, device: str) -> int:
    """What ``device`` holds while the base is being quantized beyond what training stores
    (the stand-ins' codes are in the weights already): a folder is quantized one layer at a
    time as transformers loads it onto the device, so the largest layer in the dtype it is
    quantized from; a built model (preset, factory) exists whole in model.dtype first and
    is quantized layer by layer before it is placed (training/build.py: load, prepare, then
    place), so on a CPU device every quantized layer in model.dtype plus the largest one's
    copy in the compute dtype, and on a GPU nothing (that happens in host memory). With at
    most one byte a weight of bitsandbytes' scratch for that layer (its fp32 absmax per
    64-weight block and their double quantization: about 0.1 B), and the frozen weights the
    model stage stores in the compute dtype later (techniques.quantize.store_frozen_in: the
    kept output layer), still as loaded."""
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    loading = quantize.quantized_while_loading(options.model)
    if not layers or not loading and device != "cpu":
        return 0
    loaded = TORCH_DTYPES[options.model.dtype].itemsize
    largest = max(layer.in_features * layer.out_features for layer in layers)
    if loading:
        full = largest * loaded
    else:
        full = (sum(layer.in_features * layer.out_features for layer in layers) * loaded
                + largest * quantize.compute_dtype(options.precision).itemsize)
    uncast = sum(p.numel() * (loaded - p.element_size()) for p in model.parameters()
                 if not p.requires_grad and p.is_floating_point() and p.element_size() < loaded)
    return full + largest + uncast


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


def _dequantized(shape: tuple[int, int], dtype: torch.dtype, device: torch.device
                 ) -> torch.Tensor:
    """The dense weight a dequantization writes: filled in place (no storage beyond the
    one bitsandbytes allocates), so the planner's trace counts the bytes it writes."""
    return torch.empty(shape, dtype=dtype, device=device).zero_()


class _MatMul4Bit(torch.autograd.Function):
    """x [..., in] (compute dtype) @ W^T, W [out, in]. Forward: W dequantized to x's dtype
    for the matmul only (CUDA's path past a few rows of x; on CPU it happens inside one
    bitsandbytes op, unseen by the tracker: the CPU plan counts it in excess). Only the 4-bit
    data is kept. Backward: W dequantized to the dtype it was quantized from, then cast to
    the gradient's dtype (two copies when those differ)."""

    @staticmethod
    def forward(ctx, x, quantized, shape, quantized_from):  # noqa: ANN001
        ctx.shape, ctx.quantized_from = shape, quantized_from
        return x @ _dequantized(shape, x.dtype, x.device).t()

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001
        # dequantize_4bit(...).to(grad.dtype): the first copy is gone before the matmul.
        weight = _dequantized(ctx.shape, ctx.quantized_from, grad.device)
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
        weight = _dequantized(ctx.shape, ctx.kept.dtype, grad.device)
        return grad.to(ctx.kept.dtype) @ weight, None, None


class _MatMul8bitFp(_MatMul8bitLt):
    """CPU int8: W dequantized to x's dtype, F.linear under autocast (so the output is in
    the autocast dtype); x kept on ctx. Backward as MatMul8bitLt's."""

    @staticmethod
    def forward(ctx, x, quantized, shape):  # noqa: ANN001
        ctx.shape, ctx.kept = shape, x
        return torch.nn.functional.linear(x, _dequantized(shape, x.dtype, x.device))
