"""The work of every op the planner's trace dispatches (trace.py), as techniques.work counts
it: matmul FLOPs from the shapes (torch's own FLOP formulas, torch.utils.flop_counter),
bytes moved by the other ops, and one launch per op.

- Matmuls, convolutions and attention: ``flop_registry``'s formula of the op (and of CPU's
  flash attention, which the registry does not name, by its CUDA twin's: same arguments).
  A causal attention kernel skips the blocks above the diagonal: half the FLOPs.
- Views, ``empty`` and other ops that move no data: a launch only.
- Gathers (embedding lookup, index_select, gather): the rows they read, not the table;
  fills (zeros, zero_; QLoRA's stand-in dequantization): the bytes they write.
- Every other op: the bytes of its tensor inputs and outputs (read once, written once),
  filed by the 16-bit float dtype its tensors share if they do, and the values it writes
  under its name (an op the device's profile prices per value:
  dropout's random draws).

Checkpointing's recomputation, the tiled MLP's chunks and the chunked loss run in the trace
as they run in training, so their work is counted here, op by op, with no rule of its own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from memfit.techniques.work import Key, Work, size_class

aten = torch.ops.aten

# CPU's fused attention, priced by the formulas of the CUDA op with the same arguments.
_SAME_FORMULA = {
    aten._scaled_dot_product_flash_attention_for_cpu: aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        aten._scaled_dot_product_flash_attention_backward,
}
_ATTENTION = {aten._scaled_dot_product_flash_attention_for_cpu,
              aten._scaled_dot_product_flash_attention_for_cpu_backward,
              aten._scaled_dot_product_flash_attention,
              aten._scaled_dot_product_flash_attention_backward,
              aten._scaled_dot_product_efficient_attention,
              aten._scaled_dot_product_efficient_attention_backward,
              aten._scaled_dot_product_cudnn_attention,
              aten._scaled_dot_product_cudnn_attention_backward}
_NO_DATA = {aten.empty, aten.empty_strided, aten.empty_like, aten.new_empty,
            aten.new_empty_strided, aten.detach, aten.alias, aten.lift_fresh, aten.set_,
            aten.resize_, aten._local_scalar_dense, aten.sym_size, aten.sym_stride,
            aten.sym_numel, aten.sym_storage_offset}
# Ops that read some rows of their first argument: the output's bytes, not the source's.
_GATHERS = {aten.embedding, aten.index_select, aten.index, aten.gather, aten.take}
# Ops that only write their output (a fill; the planner's stand-in of a dequantization).
_WRITES = {aten.zero_, aten.fill_, aten.zeros, aten.ones, aten.full, aten.zeros_like,
           aten.ones_like, aten.full_like}


class WorkCount:
    """Mutable totals while tracing; ``result()`` is the Work."""

    def __init__(self) -> None:
        self.calls: dict[Key, int] = {}
        self.amounts: dict[Key, int] = {}
        self.launches = 0
        self.host_copy = 0

    def result(self) -> Work:
        return Work(dict(self.calls), dict(self.amounts), self.launches, self.host_copy)

    def count(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        # Called for every op of every trace (tens of thousands per plan): what depends on
        # the op alone is looked up once per op (_rule), and tensors are found without
        # torch's pytree (aten arguments nest only in tuples, lists and dicts).
        self.launches += 1
        rule = _RULES.get(func)
        if rule is None:
            rule = _RULES[func] = _rule(func)
        kind, packet, formula = rule
        if kind is _NO_WORK:
            return
        if kind is _MATMUL:
            flops = formula(*args, **kwargs, out_val=out)
            if packet in _ATTENTION and _named(func, args, kwargs).get("is_causal"):
                flops //= 2
            dtype = next(t.dtype for t in _tensors(args))
            side = size_class(_side(packet, args, out))
            self._add(("matmul", str(dtype).removeprefix("torch."), side), flops)
            return
        written = _tensors(out)
        read = _tensors(args)
        if kwargs:
            _leaves(kwargs, read)
        outputs = _nbytes(written)
        if kind is _WRITES_ONLY:
            inputs = 0
        elif kind is _GATHER:
            inputs = outputs
        else:
            inputs = _nbytes(read)
        moved = inputs + outputs
        if moved:
            self._add(("memory", _narrow_dtype(read + written), size_class(moved)), moved)
            self._add(("elements", packet.__name__, 0), sum(t.numel() for t in written))

    def _add(self, key: Key, amount: int) -> None:
        self.calls[key] = self.calls.get(key, 0) + 1
        self.amounts[key] = self.amounts.get(key, 0) + amount


# How count() treats an op (OpOverload -> (kind, overload packet, FLOP formula)).
_NO_WORK, _MATMUL, _WRITES_ONLY, _GATHER, _MOVES = range(5)
_RULES: dict[Any, tuple[int, Any, Any]] = {}


def _rule(func: Any) -> tuple[int, Any, Any]:
    packet = func.overloadpacket
    if packet in _NO_DATA or func.is_view:
        return _NO_WORK, packet, None
    formula = flop_registry.get(_SAME_FORMULA.get(packet, packet))
    if formula is not None:
        return _MATMUL, packet, formula
    if packet in _WRITES:
        return _WRITES_ONLY, packet, None
    return (_GATHER if packet in _GATHERS else _MOVES), packet, None


def _side(packet: Any, args: tuple, out: Any) -> int:
    """The smallest dimension of the matrix product an op runs (m x k times k x n: the
    least of m, k, n), which sets how close to its peak a device runs it: a LoRA
    adapter's 4096 x 4096 times 4096 x 8 runs far below a square product of its FLOPs.
    Convolutions as the GEMM they lower to (output pixels, output channels, input
    channels x kernel); attention by the sequence and the head size."""
    tensors = [t for t in args if isinstance(t, torch.Tensor)]
    if packet in (aten.mm, aten.bmm):
        a, b = tensors[:2]
        return min(a.shape[-2], a.shape[-1], b.shape[-1])
    if packet in (aten.addmm, aten.baddbmm):
        a, b = tensors[1:3]
        return min(a.shape[-2], a.shape[-1], b.shape[-1])
    if packet in _ATTENTION:
        query = tensors[1] if packet.__name__.endswith("backward") else tensors[0]
        return min(query.shape[-2], query.shape[-1])
    # Convolutions (input, weight, ...) and their backward (grad_output, input, weight, ...).
    if packet in (aten.convolution_backward,):
        output, weight = tensors[0], tensors[2]
    else:
        output, weight = out, tensors[1]
    pixels = output.shape[0] * output[0, 0].numel()  # batch x output positions
    kernel = weight[0, 0].numel()
    return max(1, min(pixels, weight.shape[0], weight.shape[1] * kernel))


def _tensors(tree: Any) -> list[torch.Tensor]:
    return _leaves(tree, [])


def _leaves(tree: Any, found: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors in ``tree`` (tuples, lists and dict values, nested), appended in order."""
    if isinstance(tree, torch.Tensor):
        found.append(tree)
    elif isinstance(tree, (tuple, list)):
        for item in tree:
            _leaves(item, found)
    elif isinstance(tree, dict):
        for item in tree.values():
            _leaves(item, found)
    return found


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _narrow_dtype(tensors: list[torch.Tensor]) -> str:
    """The 16-bit float dtype all of an op's floating-point tensors share ("bfloat16",
    "float16"), else "": a device may run such an op at its fp32 time per value, on half
    the bytes (a CPU does), which the profile's table of that dtype prices."""
    dtypes = {t.dtype for t in tensors if t.is_floating_point()}
    if len(dtypes) == 1 and (dtype := dtypes.pop()) in (torch.bfloat16, torch.float16):
        return str(dtype).removeprefix("torch.")
    return ""


def _named(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The op's arguments by their schema names."""
    names = [argument.name for argument in func._schema.arguments]
    return {**dict(zip(names, args, strict=False)), **kwargs}
