"""FSDP2's host offload (``CPUOffloadPolicy``) counted as host memory, on a CPU device too.

With ``CPUOffloadPolicy`` each sharded parameter (a DTensor whose local tensor views
FSDP2's padded 1-D shard, ``FSDPParam._sharded_param_data``) lives in host memory; a unit
copies its shards to the device to all-gather them, each reduce-scattered gradient shard
is moved back to the host, and the optimizer steps there. On a CUDA device all of that is
CPU storage anyway. On a CPU device FSDP2's ``.to("cpu")`` calls are no-ops, so nothing
would tell the shards from the device's own memory and the gradients would stay views of
the reduce-scatter's output. ``count_shards_as_host`` makes it as on CUDA:

- the sharded parameters are tagged host (``accounting.mark_host``);
- each gradient shard FSDP2 hands over (its post-accumulate-grad hook, called on the
  sharded parameter after the reduce-scatter) is replaced by a host-tagged copy, so the
  reduce-scatter output is freed as on CUDA, and later micro-batches accumulate into it;
- the all-gather buffers, the unsharded parameters and the reduce-scatter buffers are
  fresh device storages, counted on the device as they are.

The optimizer's step on those shards runs inside ``accounting.host_allocations`` (see
``techniques.optimizer_offload.step_on_host``), so its state is host memory as well.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from memfit.accounting import HOST, host_allocations, mark_host, storages_of


def count_shards_as_host(model: nn.Module) -> None:
    """Tag ``model``'s sharded parameters as host memory and move their gradient shards to
    host-tagged storage as FSDP2 produces them. Call right after ``fully_shard``."""
    for parameter in model.parameters():
        if not isinstance(parameter, DTensor):  # replicated (ignored): stays on the device
            continue
        mark_host((parameter,))
        # On a GPU, FSDP2 already copies each gradient shard to the host itself.
        if parameter.requires_grad and parameter.device_mesh.device_type == "cpu":
            parameter.register_post_accumulate_grad_hook(_gradient_to_host)


def _gradient_to_host(parameter: torch.Tensor) -> None:
    gradient = parameter.grad
    if all(id(storage) in HOST.ids for storage in storages_of(gradient)):
        return  # a later micro-batch: FSDP2 accumulated into the host copy in place
    with torch.no_grad(), host_allocations():
        host = gradient.clone()  # a DTensor like the gradient: its shard, on the host
    mark_host((host,))
    parameter.grad = host
