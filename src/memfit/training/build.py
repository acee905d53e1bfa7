"""Assemble a run from a Config, in one documented order:

0. data.max_length within the model's context (plan.context; reads config.json only)
1. seeds                      (weights of presets, LoRA init, data split all depend on them)
   classes                    (model.task=sequence-/image-classification: model.labels and
                               model.num_labels from the training data; Run.config has them)
2. model + tokenizer          (models.load; Hugging Face folders load quantized for qlora)
3. data                       (data.build_datasets; fails early on bad rows)
4. techniques, load stage     (techniques.registry: the quantized base of built models)
5. techniques, model stage    (activation checkpointing, adapters, frozen weights in the
                               compute dtype; in the registry's order)
6. "did it apply?" checks     (each technique's check_applied; warnings are printed)
7. device                     (cuda when present, else cpu; a process's own GPU when distributed)
8. techniques, device stage   (bf16-pure weights; before FSDP2 sharding when sharded)
9. the distribution strategy  (distributed.strategies: FSDP2 sharding for fsdp)
10. optimizer, techniques of the optimizer stage (host offload), lr schedule, grad scaler
11. replicas                  (distributed.strategy=ddp: DDP and memfit's own reductions)

Nothing here writes to disk: a bad config or data file fails before a run folder exists.
"""

from __future__ import annotations

import random
import sys
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from memfit import distributed
from memfit._utils.errors import MemfitWarning
from memfit.config.schema import AdapterKind, Config, TrainConfig
from memfit.data import Splits, build_datasets, collate
from memfit.data.order import optimizer_steps
from memfit.distributed import sequence_parallel
from memfit.distributed.ddp import Replicas
from memfit.models.classifier import class_labels, with_classes
from memfit.models.export_module import exported_module
from memfit.models.load import LoadedModel, load_model
from memfit.plan.context import check_max_length
from memfit.techniques import registry
from memfit.techniques.activation_offload import ActivationOffload
from memfit.techniques.adapter_map import AdapterMap, adapter_map
from memfit.techniques.distribution import strategy_for
from memfit.techniques.optimizers import OptimizerSetting, build_optimizer
from memfit.techniques.precision import grad_scaler
from memfit.training.objective import Objective
from memfit.training.schedule import build_scheduler


@dataclass
class Run:
    config: Config
    model: nn.Module
    tokenizer: Any | None
    is_transformers: bool
    splits: Splits
    objective: Objective
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None
    device: torch.device
    total_steps: int

    eval_batch_size: int = 0  # 0: train.micro_batch_size; OOM in evaluation halves it
    activation_offload: ActivationOffload | None = None  # made for the device; enabled by config
    adapter_map: AdapterMap | None = None  # what got adapters; None without adapters
    replicas: Replicas | None = None  # distributed.strategy=ddp: how gradients are summed

    def __post_init__(self) -> None:
        self.eval_batch_size = self.eval_batch_size or self.config.train.micro_batch_size
        self.activation_offload = self.activation_offload or ActivationOffload(self.device)

    def collate(self, examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        pad_id = self.tokenizer.pad_token_id if self.tokenizer is not None else 0
        return collate(examples, pad_token_id=pad_id)

    @property
    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def examples_per_step(train: TrainConfig, sequence_groups: int) -> int:
    """Examples of one optimizer step over all ranks: ``sequence_groups`` data-parallel
    groups (a sequence group shares its examples)."""
    return train.micro_batch_size * train.gradient_accumulation_steps * sequence_groups


def total_optimizer_steps(train: TrainConfig, sequence_groups: int, train_examples: int
                          ) -> int:
    """train.max_steps, or the steps of train.epochs passes (``data.order.optimizer_steps``)."""
    return optimizer_steps(train.max_steps, train.epochs, train_examples,
                           examples_per_step(train, sequence_groups))


def warn_if_smaller_than_a_micro_batch(train: TrainConfig, sequence_groups: int,
                                       train_examples: int, total_steps: int) -> None:
    """Say how a training split smaller than one micro-batch is drawn from, and how many
    passes over it the run makes."""
    micro_batch = train.micro_batch_size * sequence_groups
    if train_examples >= micro_batch:
        return
    processes = f" x {sequence_groups} processes" if sequence_groups > 1 else ""
    passes = total_steps * examples_per_step(train, sequence_groups) / train_examples
    warnings.warn(
        f"data: the training split has {train_examples} examples, fewer than one micro-batch "
        f"of {micro_batch} (train.micro_batch_size={train.micro_batch_size}"
        f"{processes}): each micro-batch repeats examples, drawn from a fresh shuffle each "
        f"pass; {total_steps} optimizer steps make {passes:.3g} passes over them",
        MemfitWarning, stacklevel=2)


def load_base(config: Config) -> LoadedModel:
    """Steps 2 and 4: the model with its frozen base quantized as configured (shared with
    ``memfit merge``, which must rebuild exactly the base the adapters were trained on)."""
    options = registry.TechniqueOptions.of(config)
    loaded = load_model(config.model, registry.load_quantization(options),
                        images=config.data.images)
    loaded.model = registry.apply_stage("load", loaded.model, _setting(loaded.model, options,
                                                                       loaded.is_transformers))
    return loaded


def _setting(model: nn.Module, options: registry.TechniqueOptions, is_transformers: bool
             ) -> registry.Setting:
    return registry.setting(model, options, is_transformers, distributed.device().type)


def prepare_model(loaded: LoadedModel, options: registry.TechniqueOptions
                  ) -> tuple[nn.Module, list[str]]:
    """Steps 5 and 6 on a loaded base; returns the model and the checks' warnings."""
    model = registry.apply_stage("model", loaded.model, _setting(loaded.model, options,
                                                                 loaded.is_transformers))
    return model, registry.check_applied(model, options)


def place_and_optimize(model: nn.Module, options: registry.TechniqueOptions,
                       optimizer_setting: OptimizerSetting, is_transformers: bool,
                       device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Steps 8-10 on a prepared model: the device stage as the distribution strategy holds
    the model (whole, or sharded by FSDP2), then the optimizer its spec builds, wrapped by
    the optimizer stage."""
    setting = registry.setting(model, options, is_transformers, device.type)
    model = strategy_for(options.strategy).place(model, setting, device)
    optimizer = build_optimizer(model, optimizer_setting)
    return model, registry.apply_stage("optimizer", optimizer, setting)


def split_sequences(model: nn.Module, size: int, max_length: int
                    ) -> sequence_parallel.SequenceGroup | None:
    """distributed.sequence_parallel (``size``) > 1: the model's attention all-to-alls heads
    (a model it cannot split is refused) and this rank's sequence group; None otherwise."""
    if size == 1:
        return None
    sequence_parallel.use_sequence_parallel_attention(model, size, max_length)
    return sequence_parallel.new_group(size)


def build_run(config: Config) -> Run:
    check_max_length(config.model, config.data.max_length)
    seed_everything(config.train.seed)
    config = with_classes(config)
    loaded = load_base(config)
    splits = build_datasets(config.data, loaded.tokenizer, seed=config.train.seed,
                            labels=class_labels(config.model))
    options = registry.TechniqueOptions.of(config)
    model, warnings = prepare_model(loaded, options)
    exported_module(model, config.model.export_module)  # a bad name fails before training
    for warning in warnings:
        print(f"memfit: warning: {warning}", file=sys.stderr)
    adapters = (adapter_map(model, config.adapter)
                if config.adapter.kind is not AdapterKind.NONE else None)
    if adapters is not None and distributed.is_main():  # the same on every rank
        print(f"memfit: {adapters.to_text()}", file=sys.stderr)
    sequence_group = split_sequences(model, config.distributed.sequence_parallel,
                                     config.data.max_length)
    device = distributed.device()
    model, optimizer = place_and_optimize(model, options, OptimizerSetting.of(config),
                                          loaded.is_transformers, device)
    replicas = strategy_for(config.distributed.strategy).replicas(
        model, optimizer, OptimizerSetting.of(config), device)
    groups = sequence_parallel.data_parallel(config.distributed.sequence_parallel)[1]
    total_steps = total_optimizer_steps(config.train, groups, len(splits.train))
    if distributed.is_main():
        warn_if_smaller_than_a_micro_batch(config.train, groups, len(splits.train), total_steps)
    scheduler = build_scheduler(optimizer, total_steps, config.train.warmup_steps,
                                config.train.lr_schedule)
    return Run(
        config=config, model=model, tokenizer=loaded.tokenizer,
        is_transformers=loaded.is_transformers, splits=splits,
        objective=replace(Objective.of(config.model, config.memory, loaded.loss_function),
                          sequence_group=sequence_group),
        optimizer=optimizer, scheduler=scheduler,
        scaler=grad_scaler(config.precision, device), device=device, total_steps=total_steps,
        adapter_map=adapters, replicas=replicas,
    )
