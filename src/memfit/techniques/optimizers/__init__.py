"""Optimizers, one spec each (spec.py says what a spec holds; registry.py lists them):
build.py builds the one a config names; plan/costs.py, config validation
(techniques/config_checks.py), the ignored-key warnings (techniques/ignored_rules.py), the
OOM ladder (plan/strategies.py), docs/optimizers.md's table and benchmarks/optimizers.py
read the same spec.

Adding an optimizer: its update rule (memfit/optim/ or a library), one file here with its
SPEC (its options and their defaults included), one line in registry.py, its tests.
"""

from memfit.techniques.optimizers.build import build_optimizer
from memfit.techniques.optimizers.galore import projects_in_backward
from memfit.techniques.optimizers.registry import SPECS, spec_for
from memfit.techniques.optimizers.setting import OptimizerSetting
from memfit.techniques.optimizers.spec import OptimizerSpec, Param, ParamCost

__all__ = ["SPECS", "OptimizerSetting", "OptimizerSpec", "Param", "ParamCost",
           "build_optimizer", "projects_in_backward", "spec_for"]
