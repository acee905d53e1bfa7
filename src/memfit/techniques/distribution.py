"""One spec per distribution strategy (``distributed.strategy``): how it holds the model
on each process, how gradients are reduced across processes, and what the planner counts
per device. Training (``training/build.py``) and the planner read it.

- none: one process holds the whole model; its single-process checkpoint has one writer.
- ddp: every process holds the whole model, optimizer and gradients; gradients are summed
  by DDP's buckets and by memfit (``ddp.py``); rank 0 writes the single-process checkpoint.
- fsdp: each process holds 1/N of the weights, gradients and state; FSDP2 reduce-scatters
  the gradients (``fsdp.py``); optimizers whose spec says so step each process's rows as
  plain tensors (``local_rows.py``); every rank writes its shards of a DCP checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim import Optimizer

from memfit.config.schema import DistributedStrategy, Precision
from memfit.distributed import fsdp
from memfit.distributed.ddp import Replicas
from memfit.techniques import quantized_shards, registry
from memfit.techniques.blocks import choose_blocks
from memfit.techniques.distribution_moments import ddp_moments, fsdp_moments, no_moments
from memfit.techniques.distribution_traffic import (
    Traffic,
    TrafficSizes,
    ddp_traffic,
    fsdp_traffic,
    no_traffic,
)
from memfit.techniques.moments import Moment, StepBytes
from memfit.techniques.optimizers.galore import projects_in_backward
from memfit.techniques.optimizers.registry import spec_for
from memfit.techniques.optimizers.setting import OptimizerSetting


@dataclass(frozen=True)
class StrategySpec:
    name: DistributedStrategy
    # The prepared model on ``device`` with the device stage applied, held as the
    # strategy holds it.
    place: Callable[[nn.Module, registry.Setting, torch.device], nn.Module]
    # What a training step needs to reduce gradients across processes (None: the strategy
    # reduces them itself, or there is one process).
    replicas: Callable[[nn.Module, Optimizer, OptimizerSetting, torch.device], Replicas | None]
    # Whether weights, gradients and optimizer state are divided among the processes
    # (the planner's per-device bytes); otherwise each process holds all of them.
    divides_training_state: bool
    # Why it cannot train with this optimizer setting (None: it can), named by the keys to
    # change.
    refusal: Callable[[OptimizerSetting], str | None]
    # The peak moments it adds to a training step (distribution_moments.py).
    moments: Callable[[StepBytes], list[Moment]] = no_moments
    # Bytes each process sends per optimizer step (distribution_traffic.py).
    traffic: Callable[[TrafficSizes], Traffic] = no_traffic


def _trains_everything(setting: OptimizerSetting) -> None:
    return None


def _fsdp_refusal(setting: OptimizerSetting) -> str | None:
    why = spec_for(setting.optimizer).fsdp_refusal(setting)
    if why is not None:
        return why
    if setting.precision is Precision.FP16:
        return ("precision=fp16: its gradient scaler checks for inf per process, not across "
                "the sharded gradients; use precision=bf16")
    return None


def _whole(model: nn.Module, setting: registry.Setting, device: torch.device) -> nn.Module:
    return registry.apply_stage("device", model.to(device), setting)


def _sharded(model: nn.Module, setting: registry.Setting, device: torch.device) -> nn.Module:
    """FSDP2 units on the blocks checkpointing would choose (decoder layers, or
    memory.checkpoint_modules for plain modules) and the root. The device stage (bf16-pure)
    comes first: FSDP2 keeps the dtype it shards."""
    model = registry.apply_stage("device", model, setting)
    quantized_shards.make_shardable(model)  # a quantized base: codes and scales as one uint8
    memory = setting.options.memory
    blocks = choose_blocks(model, memory)
    return fsdp.shard(model, blocks, setting.options.precision, device,
                      host_offload=memory.optimizer_offload)


def _no_replicas(model: nn.Module, optimizer: Optimizer, setting: OptimizerSetting,
                 device: torch.device) -> None:
    return None


def _replicas(model: nn.Module, optimizer: Optimizer, setting: OptimizerSetting,
              device: torch.device) -> Replicas:
    return Replicas(model, optimizer, projects_in_backward(setting), device)


STRATEGIES = {
    DistributedStrategy.NONE: StrategySpec(DistributedStrategy.NONE, _whole, _no_replicas,
                                           divides_training_state=False,
                                           refusal=_trains_everything),
    DistributedStrategy.DDP: StrategySpec(DistributedStrategy.DDP, _whole, _replicas,
                                          divides_training_state=False,
                                          refusal=_trains_everything, moments=ddp_moments,
                                          traffic=ddp_traffic),
    DistributedStrategy.FSDP: StrategySpec(DistributedStrategy.FSDP, _sharded, _no_replicas,
                                           divides_training_state=True,
                                           refusal=_fsdp_refusal, moments=fsdp_moments,
                                           traffic=fsdp_traffic),
}


def strategy_for(strategy: DistributedStrategy) -> StrategySpec:
    return STRATEGIES[strategy]


def strategy_refusal(setting: OptimizerSetting) -> str | None:
    """Why distributed.strategy (``setting.strategy``) cannot train with this optimizer
    setting (None: it can)."""
    return strategy_for(setting.strategy).refusal(setting)
