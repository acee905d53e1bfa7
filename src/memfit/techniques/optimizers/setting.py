"""What an optimizer spec is handed (spec.py): the ``optimizer.*`` section and the few
facts of the run around it that change an optimizer's update or its cost, never the whole
``Config``. A spec's function reads what it needs from here, and a test builds one without
a whole config.
Its values are the config's (``of``): no defaults of its own."""

from __future__ import annotations

from dataclasses import dataclass

from memfit.config.schema import Config, DistributedStrategy, OptimizerConfig, Precision


@dataclass(frozen=True)
class OptimizerSetting:
    optimizer: OptimizerConfig  # optimizer.*
    # precision: bf16-pure needs stochastic rounding and widens bf16 gradients; fp16's
    # GradScaler must unscale whole gradients (GaLore cannot project them in backward)
    precision: Precision
    # distributed.strategy: under FSDP2 a process steps its rows of each parameter
    strategy: DistributedStrategy
    offloaded: bool  # memory.optimizer_offload: the step runs on the host
    # train.gradient_accumulation_steps and train.max_grad_norm: what layer-wise updates
    # accumulate over and clip each tensor to
    accumulation_steps: int
    max_grad_norm: float | None

    @classmethod
    def of(cls, config: Config) -> OptimizerSetting:
        return cls(config.optimizer, config.precision, config.distributed.strategy,
                   config.memory.optimizer_offload, config.train.gradient_accumulation_steps,
                   config.train.max_grad_norm)
