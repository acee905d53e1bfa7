"""The ignored-key rules the specs own: an optimizer.* key the named optimizer does not read
(its spec's ``options``, beyond the keys every optimizer reads) is ignored, and so is what
an optimizer's or a technique's own rules name."""

from __future__ import annotations

import dataclasses

from memfit.config.ignored import Rule
from memfit.config.schema import OptimizerConfig
from memfit.techniques.optimizers.options import SHARED_KEYS
from memfit.techniques.optimizers.registry import spec_for
from memfit.techniques.registry import TECHNIQUES


def optimizer_rules(optimizer: OptimizerConfig) -> list[Rule]:
    """The rules for ``optimizer``: its unread keys, then its spec's own rules."""
    spec = spec_for(optimizer)
    reads = "optimizer." + ", ".join(key for key in (*SHARED_KEYS, *spec.options)
                                     if key != "name")
    rules = [Rule((_pattern(field),), lambda c: True,
                  lambda c: f"optimizer.name={c.optimizer.name} does not read it (it reads "
                            f"{reads})")
             for field in dataclasses.fields(OptimizerConfig)
             if field.name not in SHARED_KEYS and field.name not in spec.options]
    return [*rules, *spec.ignored]


def technique_rules() -> list[Rule]:
    """Every technique spec's own rules."""
    return [rule for technique in TECHNIQUES for rule in technique.ignored]


def _pattern(field: dataclasses.Field) -> str:
    """A key, or its whole section for a mapping or a nested section."""
    sectioned = dataclasses.is_dataclass(field.default_factory) or field.default_factory is dict
    return f"optimizer.{field.name}.*" if sectioned else f"optimizer.{field.name}"
