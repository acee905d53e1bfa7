"""Know before training: itemized memory of a configuration and of every strategy, what
fits a budget, which to use and why (see docs/planner.md).

    import memfit
    result = memfit.plan(config, "24GiB")   # Plan; result.to_json() is `memfit plan --json`
    result = memfit.plan(config, "24GiB", devices=8)   # per device: ddp and fsdp rows
    from memfit.plan import recommend, next_cheaper
    name, overrides, reason = recommend(config, 24 * 2**30)
    overrides = next_cheaper(config)         # the next rung of the OOM ladder, or None

``memfit.plan`` is both this package and the function: the package's module object is
callable, so ``import memfit.plan`` (which rebinds ``memfit.plan`` to the package) does
not break ``memfit.plan(...)``.
"""

import sys
import types
from pathlib import Path
from typing import Any

from memfit.config.overrides import with_overrides
from memfit.config.schema import Config
from memfit.plan.itemize import Estimate, ExampleBatch, estimate
from memfit.plan.planner import (
    Plan,
    StrategyEstimate,
    as_config,
    plan,
    recommend,
    refuse_if_too_large,
)
from memfit.plan.strategies import next_cheaper

__all__ = ["Estimate", "Plan", "StrategyEstimate", "estimate", "next_cheaper", "plan",
           "recommend", "refuse_if_too_large", "with_overrides"]


class _CallablePackage(types.ModuleType):
    def __call__(self, config: Config | dict[str, Any] | str | Path, budget: str | int,
                 device: str = "cuda", example_batch: ExampleBatch | None = None,
                 devices: int | None = None) -> Plan:
        """``memfit.plan(config, budget)``: config as a Config, a YAML-shaped mapping or a
        YAML path; see ``planner.plan``."""
        return plan(as_config(config), budget, device, example_batch, devices)


sys.modules[__name__].__class__ = _CallablePackage
