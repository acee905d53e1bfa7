"""The quantized base in a form FSDP2 can shard: bitsandbytes' own codes, as bytes.

A bitsandbytes ``Linear4bit`` keeps its packed NF4 codes in a ``Params4bit`` and its
scales in a ``QuantState`` beside it (absmax per block of 64 weights, and when double
quantized: uint8 absmax codes, their fp32 scales per 256 blocks, an offset and two code
tables); a ``Linear8bitLt`` keeps int8 codes and one fp32 scale per row. FSDP2 shards
parameters only, and would cast any floating-point one to the gather dtype (bf16 absmax
would change the weights). So ``make_shardable`` replaces each such layer (PEFT's
``base_layer`` inside a LoRA wrapper, or a bare one) by a ``PackedQuantizedLinear``:
every tensor of the layer, viewed as bytes and concatenated, in ONE frozen 1-D uint8
parameter. FSDP2 shards it along dim 0 like any weight (integer parameters are gathered
as stored, never cast), so each process holds 1/N of the codes and of their scales; the
unit's all-gather rebuilds the whole byte string before the block runs, and ``forward``
reads the tensors back as views of it and calls the same bitsandbytes kernel with the
same ``QuantState``: the results are bit-identical to the unsharded layer.

fp32 parts come first in the byte string, so each starts at a multiple of 4 bytes (a
uint8 slice can only be viewed as fp32 there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from memfit.techniques import quantize

if TYPE_CHECKING:
    from bitsandbytes.functional import QuantState


@dataclass(frozen=True)
class Part:
    """One tensor of a quantized layer inside its byte string: bytes [start, stop)."""
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    stop: int


def _pack(tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, tuple[Part, ...]]:
    """(the tensors' bytes as one 1-D uint8 tensor, where each lies in it), widest dtype
    first so that every part is aligned to its item size."""
    ordered = sorted(tensors.items(), key=lambda item: -item[1].element_size())
    parts, chunks, start = [], [], 0
    for name, tensor in ordered:
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        parts.append(Part(name, tensor.dtype, tuple(tensor.shape), start, start + data.numel()))
        chunks.append(data)
        start += data.numel()
    return torch.cat(chunks), tuple(parts)


class PackedQuantizedLinear(nn.Module):
    """A bitsandbytes 4-bit or 8-bit linear layer whose codes and scales are the bytes of
    one frozen uint8 parameter ``packed`` (what FSDP2 shards and all-gathers)."""

    def __init__(self, layer: nn.Module) -> None:
        import bitsandbytes as bnb

        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.four_bit = isinstance(layer, bnb.nn.Linear4bit)
        if self.four_bit:
            state = layer.weight.quant_state
            tensors = {"codes": layer.weight.data, "absmax": state.absmax, "code": state.code}
            if state.nested:
                tensors.update(nested_absmax=state.state2.absmax, nested_code=state.state2.code,
                               offset=state.offset)
            # The QuantState's plain fields, to rebuild it around the gathered tensors.
            self.quant_fields = {"shape": state.shape, "blocksize": state.blocksize,
                                 "quant_type": state.quant_type, "dtype": state.dtype}
            self.nested_fields = ({"blocksize": state.state2.blocksize,
                                   "dtype": state.state2.dtype} if state.nested else None)
            # Linear4bit picks its compute dtype from its first input (set_compute_type).
            self.compute_dtype = layer.compute_dtype
            self.compute_type_is_set = layer.compute_type_is_set
        else:
            tensors = {"codes": layer.weight.data, "row_scales": quantize.int8_scales(layer)}
            self.threshold, self.use_pool = layer.state.threshold, layer.state.use_pool
        packed, self.parts = _pack(tensors)
        self.packed = nn.Parameter(packed, requires_grad=False)
        self.bias = layer.bias

    def _tensors(self) -> dict[str, torch.Tensor]:
        """Views of the (gathered) byte string: FSDP2 swaps ``packed`` for the whole one
        before forward, so this is read on every call, never cached."""
        data = self.packed
        return {part.name: data[part.start:part.stop].view(part.dtype).view(part.shape)
                for part in self.parts}

    def _quant_state(self, tensors: dict[str, torch.Tensor]) -> QuantState:
        """bitsandbytes' QuantState of a 4-bit layer around the gathered tensors."""
        from bitsandbytes.functional import QuantState

        nested = None
        if self.nested_fields is not None:
            nested = QuantState(absmax=tensors["nested_absmax"], code=tensors["nested_code"],
                                **self.nested_fields)
        return QuantState(absmax=tensors["absmax"], code=tensors["code"],
                          offset=tensors.get("offset"), state2=nested, **self.quant_fields)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.four_bit:
            return self._forward_4bit(x)
        return self._forward_8bit(x)

    def _forward_4bit(self, x: torch.Tensor) -> torch.Tensor:
        """``bnb.nn.Linear4bit.forward`` (without its CPU inference repacking, which
        memfit turns off: quantize.keep_training_layout)."""
        import bitsandbytes as bnb

        tensors = self._tensors()
        state = self._quant_state(tensors)
        if not self.compute_type_is_set:
            if x.dtype in (torch.float32, torch.bfloat16):
                self.compute_dtype = x.dtype
            self.compute_type_is_set = True
        input_dtype = x.dtype
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return bnb.matmul_4bit(x, tensors["codes"], bias=bias,
                               quant_state=state).to(input_dtype)

    def _forward_8bit(self, x: torch.Tensor) -> torch.Tensor:
        """``bnb.nn.Linear8bitLt.forward`` with a fresh matmul state per call (bitsandbytes
        keeps nothing across calls in it but the codes and scales given here)."""
        import bitsandbytes as bnb

        tensors = self._tensors()
        state = bnb.MatmulLtState()
        state.threshold, state.use_pool = self.threshold, self.use_pool
        state.has_fp16_weights, state.is_training = False, self.training
        state.CB, state.SCB = tensors["codes"], tensors["row_scales"]
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return bnb.matmul(x, tensors["codes"], bias=bias, state=state)

    def extra_repr(self) -> str:
        kind = "nf4" if self.four_bit else "int8"
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind}"


def make_shardable(model: nn.Module) -> int:
    """Replace every bitsandbytes layer in ``model`` by a ``PackedQuantizedLinear``, in
    place, one layer at a time (its tensors are copied into the byte string and freed
    with the old layer). Returns how many."""
    replaced = 0
    for name, module in list(model.named_modules()):
        if not quantize.is_quantized_layer(module):
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, PackedQuantizedLinear(module))
        replaced += 1
    return replaced
