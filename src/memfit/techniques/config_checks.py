"""A raw mapping -> a validated Config: the typed build and the rules of memfit.config, then
the rules that ask the specs (an optimizer's name, what it or a distribution strategy
cannot combine with) and the ignored-key warnings, the optimizers' derived from the keys
their specs read. The entry points every caller uses: ``from_mapping`` and ``load_config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memfit._utils.errors import ConfigError
from memfit.config.ignored import warn_ignored_keys
from memfit.config.load import build_unvalidated, read_raw
from memfit.config.schema import (
    Config,
    DistributedStrategy,
    MemoryConfig,
    OptimizerConfig,
    Precision,
)
from memfit.config.validate import validate
from memfit.techniques.distribution import strategy_refusal
from memfit.techniques.ignored_rules import optimizer_rules, own_key_defaults, technique_rules
from memfit.techniques.optimizers.options import own_options
from memfit.techniques.optimizers.registry import SPECS, spec_for
from memfit.techniques.optimizers.setting import OptimizerSetting
from memfit.techniques.optimizers.spec import OptimizerSpec
from memfit.techniques.own_keys import check_declared, technique_options
from memfit.techniques.registry import TECHNIQUES


def from_mapping(raw: dict[str, Any] | None) -> Config:
    """Build and validate a Config from a raw mapping (YAML or Python); warns about the
    keys it sets that the rest of the config ignores."""
    config = build_unvalidated(Config, raw or {}, prefix="")
    optimizer = spec_for(config.optimizer)  # an unknown optimizer.name is the first thing to say
    check_own_keys(config.optimizer, config.memory, optimizer)
    validate(config)
    check_with_specs(config)
    warn_ignored_keys(config, raw or {}, [*optimizer_rules(config.optimizer), *technique_rules()],
                      own_key_defaults())
    return config


def load_config(path: str | Path | None, overrides: list[str], base: dict[str, Any] | None = None
                ) -> Config:
    """The CLI's entry point: ``base`` (e.g. the demo) <- YAML file <- overrides."""
    return from_mapping(read_raw(path, overrides, base))


def check_own_keys(optimizer: OptimizerConfig, memory: MemoryConfig, named: OptimizerSpec
                   ) -> None:
    """The keys beyond the schema's (own_keys.py): each declared by an optimizer's or a
    technique's spec, and the named optimizer's and every technique's values valid.
    Another optimizer's own keys are ignored-key warnings (techniques/ignored_rules.py)."""
    check_declared("optimizer", OptimizerConfig, optimizer.own,
                   [spec.own for spec in SPECS.values()])
    if named.own is not None:
        own_options(named.own, optimizer)
    check_declared("memory", MemoryConfig, memory.own, [spec.own for spec in TECHNIQUES])
    for spec in TECHNIQUES:
        if spec.own is not None:
            technique_options(spec.own, memory, spec.name)


def check_with_specs(config: Config) -> None:
    """The combinations an optimizer's or a strategy's spec refuses, as ConfigErrors."""
    rounds = spec_for(config.optimizer).rounds_stochastically
    if config.precision is Precision.BF16_PURE and not rounds:
        rounding = " or ".join(name for name, spec in SPECS.items()
                               if spec.rounds_stochastically)
        raise ConfigError(
            f"precision=bf16-pure needs optimizer.name {rounding} (they update bf16 "
            f"weights with stochastic rounding), not {config.optimizer.name}")
    strategy = config.distributed.strategy
    if strategy is DistributedStrategy.NONE:
        return
    why = strategy_refusal(OptimizerSetting.of(config))
    if why is not None:
        raise ConfigError(f"distributed.strategy={strategy} cannot be combined with {why} (or "
                          "use distributed.strategy=ddp, which trains it when the model fits "
                          "on one device)")
