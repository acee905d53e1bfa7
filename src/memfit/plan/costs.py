"""Closed-form bytes: optimizer state, optimizer-step scratch, accumulation buffers, device
overhead. What an optimizer allocates comes from its spec
(memfit.techniques.optimizers: state per parameter shape, the step's scratch, which
weights it treats specially); this module adds them up over the trainable parameters of
the meta model.
"""

from __future__ import annotations

from torch import nn

from memfit.distributed.ddp import embedding_weights
from memfit.techniques.moments import OptimizerCost
from memfit.techniques.optimizers import OptimizerSetting, Param, spec_for
from memfit.techniques.optimizers.groups import split_parameters

# What a CUDA process holds besides tensors: context + cuBLAS/cuDNN workspaces (measured
# 300-600 MiB on recent GPUs), and caching-allocator fragmentation, taken as a fraction
# of peak tensor bytes.
CUDA_CONTEXT_BYTES = 512 * 2**20
ALLOCATOR_SLACK = 0.05


def trainable_params(model: nn.Module, setting: OptimizerSetting) -> list[Param]:
    """Trainable parameters (tied ones once), split as training's parameter groups are."""
    targets = spec_for(setting.optimizer).targets(model, setting)
    embeddings = {id(p) for p in embedding_weights(model)}
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    return [Param(tuple(parameter.shape), parameter.element_size(), decayed, projected,
                  row_sparse=id(parameter) in embeddings,
                  linear_weight=id(parameter) in linear)
            for decayed, projected, parameters in split_parameters(model, targets)
            for parameter in parameters]


def optimizer_cost(params: list[Param], setting: OptimizerSetting) -> OptimizerCost:
    if not params:
        return OptimizerCost(0, 0, 0, 0)
    spec = spec_for(setting.optimizer)
    costs = spec.costs(params, setting)
    accumulating = setting.accumulation_steps > 1 and setting.optimizer.layerwise
    return OptimizerCost(sum(cost.state for cost in costs),
                         spec.step_scratch(params, costs, setting),
                         max(cost.scratch for cost in costs),
                         sum(cost.accumulation for cost in costs) if accumulating else 0)


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
