"""Assemble a run from a Config, in one documented order:

1. seeds                      (weights of presets, LoRA init, data split all depend on them)
2. model + tokenizer          (models.load)
3. data                       (data.build_datasets; fails early on bad rows)
4. adapter                    (techniques.lora; freezes the base)
5. activation checkpointing   (techniques.checkpointing)
6. device                     (cuda when present, else cpu)
7. optimizer, lr schedule, grad scaler

Nothing here writes to disk: a bad config or data file fails before a run folder exists.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from memfit.config.schema import AdapterKind, Config, Task
from memfit.data import Splits, build_datasets, collate
from memfit.models.load import load_model
from memfit.techniques import checkpointing, lora
from memfit.techniques.optimizers import build_optimizer
from memfit.training.objective import Objective
from memfit.training.precision import grad_scaler
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


def total_optimizer_steps(config: Config, train_examples: int) -> int:
    if config.train.max_steps is not None:
        return config.train.max_steps
    per_step = config.train.micro_batch_size * config.train.gradient_accumulation_steps
    return max(1, math.ceil(config.train.epochs * train_examples / per_step))


def build_run(config: Config) -> Run:
    seed_everything(config.train.seed)
    loaded = load_model(config.model)
    splits = build_datasets(config.data, loaded.tokenizer, seed=config.train.seed)
    model = loaded.model
    if config.memory.gradient_checkpointing:
        model = checkpointing.apply(model, loaded.is_transformers)
    if config.adapter.kind is AdapterKind.LORA:
        model = lora.apply(model, config.adapter, loaded.is_transformers)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    optimizer = build_optimizer(model, config.optimizer)
    total_steps = total_optimizer_steps(config, len(splits.train))
    scheduler = build_scheduler(optimizer, total_steps, config.train.warmup_steps,
                                config.train.lr_schedule)
    return Run(
        config=config, model=model, tokenizer=loaded.tokenizer,
        is_transformers=loaded.is_transformers, splits=splits,
        objective=Objective(causal_lm=config.model.task is Task.CAUSAL_LM,
                            loss_function=loaded.loss_function),
        optimizer=optimizer, scheduler=scheduler,
        scaler=grad_scaler(config.precision, device), device=device, total_steps=total_steps,
    )
