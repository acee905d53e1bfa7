"""The checks of ``distributed.sequence_parallel`` that need no model (those that read the
model's heads and kind run when it is built: ``distributed.sequence_parallel``)."""

from __future__ import annotations

from memfit._utils.errors import ConfigError
from memfit.config.schema import Config, DistributedStrategy, Task


def check_sequence_parallel(config: Config) -> None:
    size = config.distributed.sequence_parallel
    if size == 1:
        return
    key = f"distributed.sequence_parallel={size}"
    strategy, nproc = config.distributed.strategy, config.distributed.nproc
    if strategy is DistributedStrategy.NONE:
        raise ConfigError(f"{key} needs distributed.strategy=ddp (every process holds the "
                          f"whole model) or fsdp (sharded over all processes)")
    if nproc > 1 and nproc % size:  # nproc 1: a launcher's WORLD_SIZE, checked at start
        valid = [n for n in range(1, nproc + 1) if nproc % n == 0]
        raise ConfigError(f"{key} must divide distributed.nproc={nproc}; valid: "
                          f"{', '.join(map(str, valid))}")
    if size > config.data.max_length:
        raise ConfigError(f"{key} is more than data.max_length={config.data.max_length} "
                          f"tokens: each process needs at least one token of a sequence; "
                          f"valid: 1 to {config.data.max_length}")
    if config.model.factory or config.model.task is not Task.CAUSAL_LM:
        what = ("a model.factory model" if config.model.factory
                else f"model.task={config.model.task.value}")
        raise ConfigError(f"{key} splits the tokens of a Hugging Face causal LM's sequences "
                          f"(rotary attention: Llama, Mistral, Qwen2/3); {what} cannot be "
                          f"split")
