"""The ignored-key rules the specs own: an optimizer.* key the named optimizer does not read
(its spec's ``options`` and ``own`` keys, beyond the keys every optimizer reads; another
optimizer's own key) is ignored, and so is what an optimizer's or a technique's own rules
name."""

from __future__ import annotations

import dataclasses
from typing import Any

from memfit.config.fields import is_own_keys
from memfit.config.ignored import Rule
from memfit.config.schema import OptimizerConfig
from memfit.techniques.optimizers.options import SHARED_KEYS
from memfit.techniques.optimizers.registry import SPECS, spec_for
from memfit.techniques.own_keys import defaults, names
from memfit.techniques.registry import TECHNIQUES


def optimizer_rules(optimizer: OptimizerConfig) -> list[Rule]:
    """The rules for ``optimizer``: its unread keys (the schema's and the other optimizers'
    own), then its spec's own rules."""
    spec = spec_for(optimizer)
    own = names(spec.own)
    reads = "optimizer." + ", ".join(key for key in (*SHARED_KEYS, *spec.options, *own)
                                     if key != "name")
    unread = [_pattern(field) for field in dataclasses.fields(OptimizerConfig)
              if field.name not in SHARED_KEYS and field.name not in spec.options
              and not is_own_keys(field)]
    unread += sorted({f"optimizer.{key}" for other in SPECS.values()
                      for key in names(other.own) if key not in own})
    rules = [Rule((pattern,), lambda c: True,
                  lambda c: f"optimizer.name={c.optimizer.name} does not read it (it reads "
                            f"{reads})")
             for pattern in unread]
    return [*rules, *spec.ignored]


def technique_rules() -> list[Rule]:
    """Every technique spec's own rules."""
    return [rule for technique in TECHNIQUES for rule in technique.ignored]


def own_key_defaults() -> dict[str, Any]:
    """Every own key an optimizer or a technique declares, dotted, with its default."""
    return {f"{section}.{key}": value
            for section, blocks in (("optimizer", [spec.own for spec in SPECS.values()]),
                                    ("memory", [spec.own for spec in TECHNIQUES]))
            for block in blocks for key, value in defaults(block).items()}


def _pattern(field: dataclasses.Field) -> str:
    """A key, or its whole section for a mapping or a nested section."""
    sectioned = dataclasses.is_dataclass(field.default_factory) or field.default_factory is dict
    return f"optimizer.{field.name}.*" if sectioned else f"optimizer.{field.name}"
