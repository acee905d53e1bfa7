"""Optimizer offload (memory.optimizer_offload): techniques/optimizer_offload.py wraps the
built optimizer."""

from __future__ import annotations

import torch

from memfit.config.schema import DistributedStrategy
from memfit.techniques.optimizer_offload import HostOffloadOptimizer, step_on_host
from memfit.techniques.specs.spec import Setting, TechniqueSpec


def apply(optimizer: torch.optim.Optimizer, setting: Setting) -> torch.optim.Optimizer:
    if setting.options.strategy is DistributedStrategy.FSDP:
        # FSDP2's CPUOffloadPolicy holds the shards on the host already: step them there.
        return step_on_host(optimizer)
    return HostOffloadOptimizer(optimizer)


SPEC = TechniqueSpec(
    name="optimizer offload",
    docs_row="optimizer-state offload: the state and its update in host memory",
    keys=("memory.optimizer_offload",),
    stage="optimizer", enabled=lambda options: options.memory.optimizer_offload,
    plan="plan.itemize counts the state, fp32 master weights and grads and the step's "
         "scratch as host bytes, none of them on the device (on a CPU device too: the "
         "copies are host-tagged storage the tracker counts apart); under FSDP2 its "
         "CPUOffloadPolicy (distributed.fsdp, distributed.host_offload) keeps the "
         "sharded weights, grads and state on the host and steps there",
    apply=apply, row_reset=("memory.optimizer_offload",), level="+offload")
