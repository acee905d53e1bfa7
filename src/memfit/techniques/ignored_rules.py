"""The optimizers' ignored-key rules, derived from their specs: an optimizer.* key the
named optimizer does not read (its spec's ``options``, beyond the keys every optimizer
reads) is ignored, and so is what the spec's own rules name."""

from __future__ import annotations

import dataclasses

from memfit.config.ignored import Rule
from memfit.config.schema import Config, OptimizerConfig
from memfit.techniques.optimizers.options import SHARED_KEYS
from memfit.techniques.optimizers.registry import spec_for


def optimizer_rules(config: Config) -> list[Rule]:
    """The rules for ``config``'s optimizer: its unread keys, then its own rules."""
    spec = spec_for(config)
    reads = "optimizer." + ", ".join(key for key in (*SHARED_KEYS, *spec.options)
                                     if key != "name")
    rules = [Rule((_pattern(field),), lambda c: True,
                  lambda c: f"optimizer.name={c.optimizer.name} does not read it (it reads "
                            f"{reads})")
             for field in dataclasses.fields(OptimizerConfig)
             if field.name not in SHARED_KEYS and field.name not in spec.options]
    return [*rules, *spec.ignored]


def _pattern(field: dataclasses.Field) -> str:
    """A key, or its whole section for a mapping or a nested section."""
    sectioned = dataclasses.is_dataclass(field.default_factory) or field.default_factory is dict
    return f"optimizer.{field.name}.*" if sectioned else f"optimizer.{field.name}"
