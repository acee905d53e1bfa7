"""``TechniqueOptions``: the sections of the config a memory technique reads (its spec in
techniques/specs/, its code here), so that none of them is handed the whole config."""

from __future__ import annotations

from dataclasses import dataclass

from memfit.config.schema import (
    AdapterConfig,
    Config,
    DistributedStrategy,
    MemoryConfig,
    ModelConfig,
    Precision,
)


@dataclass(frozen=True)
class TechniqueOptions:
    """What a memory technique reads of the config: what is trained and how it is held."""

    model: ModelConfig
    adapter: AdapterConfig
    precision: Precision
    memory: MemoryConfig
    strategy: DistributedStrategy  # distributed.strategy: how the optimizer offload steps

    @classmethod
    def of(cls, config: Config) -> TechniqueOptions:
        return cls(config.model, config.adapter, config.precision, config.memory,
                   config.distributed.strategy)
