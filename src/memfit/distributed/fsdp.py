"""FSDP2 (``torch.distributed.fsdp.fully_shard``) over each block and the root.

Each block (a transformer decoder layer, or the blocks ``memory.checkpoint_modules``
names in a plain module) becomes one all-gather unit: its weights exist in full only
while it runs; the root unit holds the rest (embeddings, final norm, head). Parameters,
gradients and optimizer state are sharded along dim 0 across the processes.

- Mixed precision: with precision=bf16 the all-gathered weights are bf16 (what autocast
  would compute with anyway) and gradients are reduced in fp32.
- Gradients are SUMMED across ranks, not averaged: the loop already divides every
  micro-batch's loss sum by the item count of the global effective batch.
- Host offload (memory.optimizer_offload=true): FSDP2's CPUOffloadPolicy keeps the
  sharded parameters, their gradients and so the optimizer state in host memory; each
  unit copies its shards to the device to all-gather them, the gradients come back after
  the reduce-scatter, and the optimizer steps on the host (``host_offload.py`` tags all of
  it as host memory, so the CPU tracker counts it apart on a CPU device too).
- Quantized frozen weights (bitsandbytes 4-bit / 8-bit: integer codes whose scales live
  beside them as quant state) are sharded too: each layer's codes and scales become the
  bytes of one uint8 parameter first (``techniques/quantized_shards.py``, applied by the
  fsdp strategy spec before ``shard``), which FSDP2 shards and
  gathers like any weight and never casts.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from memfit.config.schema import Precision
from memfit.distributed.process_group import world_size

# torch.distributed.fsdp imports DTensor (~1 s, sympy): imported when a model is sharded
if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

_GATHER_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}


def mixed_precision(precision: Precision) -> MixedPrecisionPolicy:
    """bf16/fp16 autocast: gather weights in that dtype, reduce gradients in fp32.
    fp32 and bf16-pure (already bf16 weights): gather the weights as stored."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    gather = _GATHER_DTYPES.get(precision)
    return MixedPrecisionPolicy(param_dtype=gather,
                                reduce_dtype=torch.float32 if gather is not None else None)


def shard(model: nn.Module, blocks: list[nn.Module], precision: Precision,
          device: torch.device, host_offload: bool = False) -> nn.Module:
    """Shard ``model`` in place across the process group: one unit per block, then the
    root. Parameters move to ``device`` as they are sharded, or stay in host memory with
    ``host_offload``. A quantized base must be in its packed form already
    (``techniques.quantized_shards``, which the fsdp strategy spec applies)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard

    from memfit.distributed.host_offload import count_shards_as_host

    mesh = init_device_mesh(device.type, (world_size(),))
    options = {"mesh": mesh, "mp_policy": mixed_precision(precision),
               "offload_policy": (CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
                                  if host_offload else OffloadPolicy())}
    for block in blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
    if host_offload:
        count_shards_as_host(model)
    for unit in (module for module in model.modules() if isinstance(module, FSDPModule)):
        # Sum (set per unit: the setters do not recurse), as a plain SUM: gloo has no
        # pre-multiplied reduction.
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return model


def is_sharded(model: nn.Module) -> bool:
    # if torch.distributed.fsdp was never imported, no module is an FSDPModule
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)
