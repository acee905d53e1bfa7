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
from memfit.config.schema import Config, DistributedStrategy, Precision
from memfit.config.validate import validate
from memfit.techniques.distribution import strategy_refusal
from memfit.techniques.ignored_rules import optimizer_rules, technique_rules
from memfit.techniques.optimizers.own_options import check_own_keys
from memfit.techniques.optimizers.registry import SPECS, spec_for
from memfit.techniques.optimizers.setting import OptimizerSetting


def from_mapping(raw: dict[str, Any] | None) -> Config:
    """Build and validate a Config from a raw mapping (YAML or Python); warns about the
    keys it sets that the rest of the config ignores."""
    config = build_unvalidated(Config, raw or {}, prefix="")
    # An unknown optimizer.name is the first thing to say, then its keys.
    check_own_keys(config.optimizer, spec_for(config.optimizer), SPECS.values())
    validate(config)
    check_with_specs(config)
    warn_ignored_keys(config, raw or {}, [*optimizer_rules(config.optimizer), *technique_rules()])
    return config


def load_config(path: str | Path | None, overrides: list[str], base: dict[str, Any] | None = None
                ) -> Config:
    """The CLI's entry point: ``base`` (e.g. the demo) <- YAML file <- overrides."""
    return from_mapping(read_raw(path, overrides, base))


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
