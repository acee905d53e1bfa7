"""Cross-key rules, checked before anything is built.

Each rule raises a ConfigError naming the keys involved and what would be valid.
Features whose issue has not landed yet are rejected here with "not yet supported",
never silently ignored; each such line is removed when the feature lands.
"""

from __future__ import annotations

from memfit._utils.errors import ConfigError
from memfit._utils.sizes import parse_bytes
from memfit.config.schema import (
    AdapterKind,
    Config,
    DataFormat,
    DistributedStrategy,
    OptimizerName,
    Precision,
    Task,
)


def validate(config: Config) -> None:
    _check_model(config)
    _check_numbers(config)
    _check_combinations(config)
    _check_not_yet_supported(config)


def _check_model(config: Config) -> None:
    model = config.model
    sources = {"model.path": model.path, "model.preset": model.preset,
               "model.factory": model.factory}
    given = [key for key, value in sources.items() if value]
    if len(given) != 1:
        found = f"got {', '.join(given)}" if given else "got none"
        raise ConfigError(f"set exactly one of model.path, model.preset, model.factory ({found})")
    if model.loss and not model.factory:
        raise ConfigError("model.loss applies only to model.factory models")
    for key in ("factory", "loss"):
        value = getattr(model, key)
        if value and ":" not in value:
            raise ConfigError(f"model.{key}={value!r} must look like 'package.module:function'")
    if config.data.path is None:
        raise ConfigError("data.path is not set: name a data file or folder")


def _check_numbers(config: Config) -> None:
    positive = {
        "data.max_length": config.data.max_length,
        "adapter.rank": config.adapter.rank,
        "train.micro_batch_size": config.train.micro_batch_size,
        "train.gradient_accumulation_steps": config.train.gradient_accumulation_steps,
        "train.keep_checkpoints": config.train.keep_checkpoints,
        "log.every": config.log.every,
        "distributed.nproc": config.distributed.nproc,
        "optimizer.galore.rank": config.optimizer.galore.rank,
        "optimizer.galore.update_gap": config.optimizer.galore.update_gap,
    }
    if config.train.max_steps is not None:
        positive["train.max_steps"] = config.train.max_steps
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key} must be at least 1, got {value}")
    non_negative = {
        "train.warmup_steps": config.train.warmup_steps,
        "train.eval_every": config.train.eval_every,
        "train.save_every": config.train.save_every,
        "optimizer.weight_decay": config.optimizer.weight_decay,
        "adapter.dropout": config.adapter.dropout,
    }
    for key, value in non_negative.items():
        if value < 0:
            raise ConfigError(f"{key} must be 0 or more, got {value}")
    if config.optimizer.lr <= 0:
        raise ConfigError(f"optimizer.lr must be positive, got {config.optimizer.lr}")
    if not 0 <= config.data.eval_fraction < 1:
        raise ConfigError(f"data.eval_fraction must be in [0, 1), got {config.data.eval_fraction}")
    if config.train.max_steps is None and config.train.epochs <= 0:
        raise ConfigError(f"train.epochs must be positive, got {config.train.epochs}")
    if config.train.max_grad_norm is not None and config.train.max_grad_norm <= 0:
        raise ConfigError("train.max_grad_norm must be positive, or null to disable clipping")
    if config.memory.budget is not None:
        try:
            parse_bytes(config.memory.budget)
        except ValueError as error:
            raise ConfigError(f"memory.budget: {error}") from None


def _check_combinations(config: Config) -> None:
    task, data_format = config.model.task, config.data.format
    token_formats = {DataFormat.TEXT, DataFormat.INSTRUCTION, DataFormat.CHAT}
    if task is Task.CAUSAL_LM and data_format not in token_formats:
        raise ConfigError(
            f"model.task=causal-lm needs data.format text, instruction or chat, not {data_format}"
        )
    if task is Task.CUSTOM and not config.model.factory:
        raise ConfigError("model.task=custom needs model.factory")
    if config.memory.auto and config.memory.budget is None:
        raise ConfigError("memory.auto=true needs memory.budget (e.g. memory.budget=24GiB)")


# Keys whose feature lands with a later issue: (predicate, message).
_NOT_YET = [
    (lambda c: c.adapter.kind is AdapterKind.QLORA, "adapter.kind=qlora"),
    (lambda c: c.optimizer.name is OptimizerName.GALORE, "optimizer.name=galore"),
    (lambda c: c.optimizer.name is OptimizerName.PAGED_ADAMW8BIT,
     "optimizer.name=paged_adamw8bit"),
    (lambda c: c.optimizer.layerwise, "optimizer.layerwise=true"),
    (lambda c: c.precision is Precision.BF16_PURE, "precision=bf16-pure"),
    (lambda c: c.memory.optimizer_offload, "memory.optimizer_offload=true"),
    (lambda c: c.memory.chunked_loss, "memory.chunked_loss=true"),
    (lambda c: c.memory.budget is not None, "memory.budget"),
    (lambda c: c.memory.auto, "memory.auto=true"),
    (lambda c: c.distributed.strategy is not DistributedStrategy.NONE,
     "distributed.strategy=fsdp"),
    (lambda c: c.distributed.nproc != 1, "distributed.nproc > 1"),
    (lambda c: c.data.format is DataFormat.IMAGES, "data.format=images"),
    (lambda c: c.model.task in (Task.AUTOENCODER, Task.SEQUENCE_CLASSIFICATION),
     "model.task=autoencoder / sequence-classification"),
]


def _check_not_yet_supported(config: Config) -> None:
    for applies, what in _NOT_YET:
        if applies(config):
            raise ConfigError(f"{what} is not yet supported in this version of memfit")
