"""What memfit knows about one optimizer, in one place: ``OptimizerSpec``.

Training builds the optimizer from it (build.py), the planner costs its state and step
scratch from it (plan/costs.py), config validation asks it what it cannot combine with
(config/validate.py), and the OOM ladder asks it for a cheaper setting
(plan/strategies.py). One file per optimizer in this package holds its spec; registry.py
lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from torch.optim import Optimizer

from memfit.config.ignored import Rule
from memfit.techniques.moments import Moment, StepBytes
from memfit.techniques.optimizers.setting import OptimizerSetting
from memfit.techniques.optimizers.step_moments import step_moments
from memfit.techniques.optimizers.step_work import OTHER, BackwardWork, StepWork, streaming

# A function building the optimizer over parameter groups (build.parameter_groups).
Factory = Callable[[list[dict]], Optimizer]


@dataclass(frozen=True)
class Param:
    """One trainable parameter as the optimizer sees it (what the planner keeps of it)."""

    shape: tuple[int, ...]
    element_size: int
    decayed: bool  # in a weight-decay group (matrices of linear/conv layers)
    projected: bool  # one of the weights the optimizer treats specially (GaLore's targets)
    # An untied input embedding: under data parallel memfit sums only its touched rows
    # (memfit.distributed.ddp), outside DDP's buckets.
    row_sparse: bool = False
    # The weight of an nn.Linear (GaLore projects only those in backward:
    # memfit.optim.backward_projection).
    linear_weight: bool = False

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size


@dataclass(frozen=True)
class ParamCost:
    state: int  # persistent optimizer state
    scratch: int  # extra bytes alive at the worst moment of this parameter's update
    accumulation: int  # its buffer when layer-wise updates accumulate micro-batches


def no_targets(model: nn.Module, setting: OptimizerSetting) -> set[int] | None:
    return None


def trains_under_fsdp(setting: OptimizerSetting) -> str | None:
    return None


def never_cheaper(setting: OptimizerSetting) -> dict | None:
    return None


def largest_scratch(params: list[Param], costs: list[ParamCost],
                    setting: OptimizerSetting) -> int:
    """The step updates one parameter at a time: the largest one's scratch."""
    return max((cost.scratch for cost in costs), default=0)


# The modes benchmarks/optimizers.py runs by default: (optimizer.layerwise, precision).
PLAIN, LAYERWISE = (False, "fp32"), (True, "fp32")
PURE, PURE_LAYERWISE = (False, "bf16-pure"), (True, "bf16-pure")


@dataclass(frozen=True)
class BenchLine:
    """One line of benchmarks/optimizers.py: its label, the overrides that select it, and
    the (layerwise, precision) modes its default run measures (``--all`` measures every
    mode the optimizer accepts)."""

    label: str
    settings: Mapping[str, str]
    modes: tuple[tuple[bool, str], ...] = (PLAIN, LAYERWISE)


@dataclass(frozen=True)
class OptimizerSpec:
    name: str  # optimizer.name
    # Its row in docs/optimizers.md: (what implements it, the state it keeps per parameter).
    docs_row: tuple[str, str]
    # Every callable below is handed the optimizer's setting (setting.py), never the whole
    # config. The setting -> a factory over parameter groups; raises ConfigError where this
    # machine cannot run it.
    factory: Callable[[OptimizerSetting], Factory]
    # Bytes per trainable parameter, in the order given.
    costs: Callable[[list[Param], OptimizerSetting], list[ParamCost]]
    # The optimizer.* keys it reads besides name, lr, weight_decay and layerwise, each with
    # its own default for when the config leaves the key null (options.resolved_option).
    # Any other optimizer.* key the user sets gets an ignored-key warning.
    options: Mapping[str, Any] = field(default_factory=dict)
    # Its own keys, which no shared optimizer.* key covers: a frozen dataclass of doc()
    # fields (default, limits, help), written as optimizer.<key>; docs/config.md and
    # --help list them, the load checks them, ``options.own_options`` reads them.
    own: type | None = None
    # Keys its own settings make ignored: config/ignored.py's rules, applied when it is the
    # optimizer named.
    ignored: tuple[Rule, ...] = ()
    # Its lines in benchmarks/optimizers.py; None: one line, its name, in the default modes.
    bench: tuple[BenchLine, ...] | None = None
    # Extra bytes alive at the worst moment of optimizer.step() over all parameters.
    step_scratch: Callable[[list[Param], list[ParamCost], OptimizerSetting], int] = (
        largest_scratch)
    # ids of the weights it treats specially (GaLore: the ones it projects), None when it
    # treats none specially; training and the planner both call it.
    targets: Callable[[nn.Module, OptimizerSetting], set[int] | None] = no_targets
    # Updates bf16 weights with stochastic rounding, so precision=bf16-pure may use it.
    rounds_stochastically: bool = False
    # Under FSDP2, step each process's rows of the sharded parameters as plain tensors
    # (memfit.distributed.local_rows) instead of the DTensors themselves: bitsandbytes'
    # kernels take plain tensors, and an optimizer that reads whole tensors sums its
    # partial results over the processes (``set_row_shards``).
    steps_local_rows: bool = False
    # With steps_local_rows: the state one process keeps for its rows (an int) of a
    # parameter; None: the state of a parameter shaped like those rows (``costs``).
    row_shard_state: Callable[[Param, OptimizerSetting, int], int] | None = None
    # Why distributed.strategy=fsdp cannot train it with these settings, naming the key to
    # change (None: it can).
    fsdp_refusal: Callable[[OptimizerSetting], str | None] = trains_under_fsdp
    # The OOM ladder's rung: overrides making it cheaper, or None.
    cheaper: Callable[[OptimizerSetting], dict | None] = never_cheaper
    # Its peak moments in a training step (the planner takes the largest of every
    # contributor's): the optimizer step, or layer-wise updates inside backward.
    moments: Callable[[StepBytes, OptimizerSetting], list[Moment]] = step_moments
    # What its step asks of the device (step_work.py): the planner's time for it. The
    # default: an element-wise update of 12 passes and 8 ops per parameter.
    step_work: StepWork = streaming(OTHER)
    # How it changes one micro-batch's backward, for a micro-batch of this many tokens:
    # (work the planner's trace counted that training does not do, work done instead);
    # None: backward runs as traced.
    backward_work: BackwardWork | None = None
    # The planner's full-parameter methods of it (plan/strategies.py): (row name, overrides
    # beyond optimizer.name), in order of preference; none: the planner does not compare it.
    plan_methods: tuple[tuple[str, Mapping[str, Any]], ...] = ()


def bench_lines(spec: OptimizerSpec) -> tuple[BenchLine, ...]:
    if spec.bench is not None:
        return spec.bench
    return (BenchLine(spec.name, {"optimizer.name": spec.name}),)


def per_param(cost: Callable[[Param, OptimizerSetting], ParamCost]
              ) -> Callable[[list[Param], OptimizerSetting], list[ParamCost]]:
    """A spec's ``costs`` from a function of one parameter."""
    return lambda params, setting: [cost(param, setting) for param in params]
