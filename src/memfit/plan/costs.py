"""Closed-form bytes: optimizer state, optimizer-step scratch, accumulation buffers, device
overhead. Per parameter, from its shape and dtype (the trainable parameters of the meta
model), following what each optimizer really allocates:

- ``adamw`` (torch, foreach): exp_avg + exp_avg_sq in the parameter's dtype and a 4-byte
  ``step``; the step allocates sqrt(exp_avg_sq) for a whole parameter group at once.
- ``adamw`` with ``precision=bf16-pure``: memfit's AdamW, fp32 moments (8 bytes / param),
  scratch of a few fp32 row chunks of one parameter at a time (memfit.optim.inner:
  parameters over CHUNK_ELEMENTS values are updated a chunk of rows at a time).
- ``adamw8bit`` (bitsandbytes): two uint8 moments + one fp32 absmax per 256 values;
  tensors under 4096 values keep fp32 moments (REFERENCE.md).
- ``adafactor`` (torch): factored second moment (row and column means) for >= 2-D
  tensors, a full one for vectors; no first moment.
- ``galore`` (memfit): for each projected matrix viewed s x l (s <= l), P (s x r, fp32)
  and the inner rule's moments on R (r x l); the rest get the inner rule unprojected, in
  row chunks like memfit's AdamW.
  2-D weights are projected when their smaller side exceeds the rank, except embeddings
  and the output layer (REFERENCE.md: only attention and MLP matrices).
- ``sgd``: nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from memfit.config.schema import Config, GaloreInner, OptimizerName, Precision
from memfit.optim.inner import CHUNK_ELEMENTS
from memfit.optim.quantize import quantized_bytes

# bitsandbytes 8-bit optimizers keep fp32 state for tensors smaller than this.
BNB_MIN_8BIT_SIZE = 4096
QUANT_BLOCK = 256  # values per absmax scale, bitsandbytes and memfit.optim alike
# What a CUDA process holds besides tensors: context + cuBLAS/cuDNN workspaces (measured
# 300-600 MiB on recent GPUs), and caching-allocator fragmentation, taken as a fraction
# of peak tensor bytes.
CUDA_CONTEXT_BYTES = 512 * 2**20
ALLOCATOR_SLACK = 0.05


@dataclass(frozen=True)
class Param:
    """One trainable parameter as the optimizer sees it."""

    shape: tuple[int, ...]
    element_size: int
    projectable: bool  # a 2-D weight of a block (not an embedding or the output layer)

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size


@dataclass(frozen=True)
class OptimizerCost:
    state_bytes: int  # persistent optimizer state
    step_scratch_bytes: int  # extra bytes alive at the worst moment of optimizer.step()
    per_param_scratch_bytes: int  # the same for one parameter at a time (layer-wise step)
    accumulation_buffer_bytes: int  # layer-wise with accumulation: where grads accumulate


def trainable_params(model: nn.Module) -> list[Param]:
    """Trainable parameters (tied ones once) with their optimizer-relevant traits."""
    looked_up = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if head is not None:
        looked_up.add(id(head.weight))
    seen: set[int] = set()
    params = []
    for parameter in model.parameters():
        if parameter.requires_grad and id(parameter) not in seen:
            seen.add(id(parameter))
            params.append(Param(tuple(parameter.shape), parameter.element_size(),
                                parameter.dim() >= 2 and id(parameter) not in looked_up))
    return params


def _matrix_sides(param: Param) -> tuple[int, int]:
    rows = param.shape[0]
    columns = param.numel // rows
    return min(rows, columns), max(rows, columns)


def _inner_state(numel: int, shape: tuple[int, ...], inner: GaloreInner) -> int:
    if inner is GaloreInner.ADAMW8BIT:
        return 2 * quantized_bytes(numel)
    if inner is GaloreInner.ADAFACTOR:
        if len(shape) >= 2:
            return 4 * (shape[0] + numel // shape[0])
        return 4 * numel
    return 8 * numel


# fp32 row chunks alive at once in memfit's chunked updates (measured by
# tests/unit/optim/test_optim_chunked_updates.py: at most 2 for adamw, 2.25 for adafactor,
# 4.5 for 8-bit moments, which decode both moments and encode them again).
_CHUNKS_ALIVE = {GaloreInner.ADAMW: 2, GaloreInner.ADAFACTOR: 3, GaloreInner.ADAMW8BIT: 5}


def _chunk_bytes(numel: int) -> int:
    """Bytes of one fp32 row chunk of a parameter with `numel` values."""
    return 4 * min(numel, CHUNK_ELEMENTS)


def _galore_param(param: Param, config: Config) -> tuple[int, int, int]:
    """(state, scratch, accumulation buffer) bytes of one parameter under GaLore."""
    galore = config.optimizer.galore
    small, large = _matrix_sides(param) if param.projectable else (0, 0)
    chunks = _CHUNKS_ALIVE[galore.inner] * _chunk_bytes(param.numel)
    if small > galore.rank:
        rank = galore.rank
        state = 4 * small * rank + _inner_state(rank * large, (rank, large), galore.inner)
        # An fp32 copy of a bf16 G (s x l; fp32 G is only viewed), R and the inner rule's
        # work on it (3 x r x l), and the projected-back update, a row chunk at a time.
        widened = 4 * small * large if param.element_size < 4 else 0
        return state, widened + 4 * 3 * rank * large + chunks, 4 * rank * large
    state = _inner_state(param.numel, param.shape, galore.inner)
    return state, chunks, param.nbytes


def optimizer_cost(params: list[Param], config: Config) -> OptimizerCost:
    name = config.optimizer.name
    states, scratch = [], []
    buffers = 0
    for param in params:
        numel, nbytes = param.numel, param.nbytes
        buffer = nbytes
        if name is OptimizerName.GALORE:
            state, work, buffer = _galore_param(param, config)
        elif name is OptimizerName.ADAMW and config.precision is Precision.BF16_PURE:
            # fp32 grad, moment math and rounding, a row chunk at a time.
            state, work = 8 * numel, _CHUNKS_ALIVE[GaloreInner.ADAMW] * _chunk_bytes(numel)
        elif name is OptimizerName.ADAMW:
            state, work = 2 * nbytes + 4, nbytes  # sqrt(exp_avg_sq), per group
        elif name in (OptimizerName.ADAMW8BIT, OptimizerName.PAGED_ADAMW8BIT):
            small = numel < BNB_MIN_8BIT_SIZE
            state = 8 * numel if small else 2 * numel + 2 * 4 * -(-numel // QUANT_BLOCK)
            work = 3 * 4 * numel  # dequantized fp32 moments and the update
        elif name is OptimizerName.ADAFACTOR:
            factored = len(param.shape) >= 2
            rows_and_columns = (numel // param.shape[-1] + numel // param.shape[-2]
                                if factored else numel)
            state, work = rows_and_columns * param.element_size + 4, 2 * nbytes
        else:  # sgd without momentum
            state, work = 0, 0
        states.append(state)
        scratch.append(work)
        buffers += buffer
    if not params:
        return OptimizerCost(0, 0, 0, 0)
    per_param = max(scratch)
    # torch's foreach AdamW computes sqrt(exp_avg_sq) for a whole parameter group at once;
    # the groups (decayed matrices, the rest) are stepped one after the other.
    whole_group = name is OptimizerName.ADAMW and config.precision is not Precision.BF16_PURE
    step_scratch = _largest_group_bytes(params) if whole_group else per_param
    accumulating = config.train.gradient_accumulation_steps > 1 and config.optimizer.layerwise
    return OptimizerCost(sum(states), step_scratch, per_param, buffers if accumulating else 0)


def _largest_group_bytes(params: list[Param]) -> int:
    matrices = sum(p.nbytes for p in params if len(p.shape) >= 2 and p.projectable)
    rest = sum(p.nbytes for p in params) - matrices
    return max(matrices, rest)


def device_overhead_bytes(peak_tensor_bytes: int, device: str) -> int:
    """Memory the device loses beyond live tensors (nothing on CPU: the tracker's view)."""
    if device == "cpu":
        return 0
    return CUDA_CONTEXT_BYTES + int(ALLOCATOR_SLACK * peak_tensor_bytes)


def weight_bytes(model: nn.Module) -> int:
    """Distinct storages of parameters and buffers (tied weights once)."""
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def largest_trainable_bytes(params: list[Param]) -> int:
    return max((p.nbytes for p in params), default=0)


def grad_bytes(params: list[Param]) -> int:
    return sum(p.nbytes for p in params)
