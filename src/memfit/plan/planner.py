"""``plan``: every strategy's bytes and predicted step time, what fits a budget, and the
recommendation and why (choose.py: the fastest mix of the most preferred method that fits,
or the fastest row, at the largest micro-batch that fits with the accumulation keeping the
effective batch).

``recommend`` (auto-fit) and ``strategies.next_cheaper`` (OOM recovery) are what the
training side uses; ``refuse_if_too_large`` is the check ``memfit train`` makes before
building a model for real.

Without a budget every strategy is still planned; only what fits (and so the
recommendation) needs one, which defaults to the GPU's memory where one is present.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memfit._utils.errors import ConfigError, MemfitError, OutOfMemoryPlanError
from memfit._utils.sizes import format_bytes, parse_bytes
from memfit.config.limits import (
    MAX_DEVICES,
    check_bytes,
    check_control_characters,
    check_count,
)
from memfit.config.overrides import Overrides, with_overrides
from memfit.config.schema import AdapterKind, Config, DistributedStrategy, Task
from memfit.config.validate import check_numbers, check_rope_scaling
from memfit.plan import meta
from memfit.plan.choose import StrategyEstimate, check_preference, choose, itemized, sharded_first
from memfit.plan.context import check_max_length
from memfit.plan.devices import ASSUMED_GPU, BUILTIN, DeviceProfile
from memfit.plan.itemize import Estimate, ExampleBatch, estimate
from memfit.plan.planned_device import planned_device
from memfit.plan.search import with_fitted
from memfit.plan.sequence_rows import split_rows, widest_split
from memfit.plan.step_time import StepTime, step_time
from memfit.plan.strategies import strategies
from memfit.techniques import chunked_loss
from memfit.techniques.config_checks import check_own_keys
from memfit.techniques.distribution import strategy_refusal
from memfit.techniques.optimizers import spec_for
from memfit.techniques.optimizers.setting import OptimizerSetting
from memfit.techniques.tiled_mlp import MLPS
from memfit.techniques.tiled_norms import NORMS


@dataclass(frozen=True)
class Plan:
    budget_bytes: int | None  # per device; None: no budget given and no GPU to take it from
    device: str  # the kind planned for: "cuda" or "cpu"
    devices: int  # processes, one device each
    config: Estimate  # exactly the given configuration, under its own distributed.strategy
    config_distributed: str  # that strategy: none (one device), ddp or fsdp
    strategies: list[StrategyEstimate]  # in order of preference
    skipped: dict[str, str]  # strategy -> why it cannot be built for this model
    recommended: str | None
    recommended_overrides: Overrides  # the strategy's, plus the proposed micro-batch
    reason: str
    profile: DeviceProfile  # where the step times come from
    config_time: StepTime  # the given configuration's
    recommended_time: StepTime | None  # at the recommended micro-batch
    calibrated: str | None = None  # the line to show when this plan calibrated the device
    label: str = ""  # the device as the table's header names it (device_label)

    def to_json(self) -> dict[str, Any]:
        """The documented --json schema (docs/planner.md)."""
        return {
            "device": self.device,
            "device_assumed": device_assumed(self.device),
            "device_profile": {"name": self.profile.name, "source": self.profile.source},
            "devices": self.devices,
            "config": {**self.config.to_json(), **self.config_time.to_json(),
                       "distributed": self.config_distributed},
            "strategies": [{**s.estimate.to_json(), **s.time.to_json(), "name": s.name,
                            "distributed": s.distributed, "overrides": s.overrides,
                            "fits": s.fits} for s in self.strategies],
            "skipped": dict(self.skipped),
            "recommended": self.recommended,
            "recommended_step_seconds": (None if self.recommended_time is None
                                         else self.recommended_time.seconds),
            "reason": self.reason,
        }


def plan(config: Config, budget: str | int | None = None, device: str = "cuda",
         example_batch: ExampleBatch | None = None, devices: int | None = None,
         prefer: str = "quality", any_method: bool = False) -> Plan:
    """Plan ``config`` against ``budget`` ("24GiB", bytes) on ``device``: "cuda" adds the
    CUDA context and allocator slack; "cpu" counts tensors only, as the CPU tracker does;
    a builtin GPU's name (devices.BUILTIN: "h100", "rtx-4090", ...) plans for that GPU.
    Step times come from the device's profile: this machine's, calibrated on first use
    (cpu, or cuda where a GPU is here), else the builtin's (``devices.planned_device``).
    ``budget`` None: the GPU's memory (this one's, or the named builtin's); without one,
    every strategy's bytes and no fits or recommendation.
    ``example_batch``: one micro-batch of inputs, needed for model.factory models.
    ``devices`` (default: distributed.nproc) > 1: bytes per device of training as that many
    processes, every strategy both under ddp (each holds the whole model) and under fsdp
    (sharded), with the micro-batch per device; what FSDP2 cannot train is skipped for
    fsdp, with the reason. The given config is planned under its own distributed.strategy
    (ddp when it names none). With memory.auto_keep_adapters only the strategies with
    adapters are planned and recommended (the others are skipped, with that reason).
    ``prefer`` / ``any_method``: how the recommendation weighs time (choose.py)."""
    check_max_length(config.model, config.data.max_length)
    check_preference(prefer)
    target = planned_device(device)
    kind, profile = target.kind, target.profile
    budget_bytes = default_budget(device) if budget is None else parse_budget(budget)
    devices = config.distributed.nproc if devices is None else devices
    check_count("--devices", devices, 1, MAX_DEVICES)
    own = config.distributed.strategy
    if devices > 1 and own is DistributedStrategy.NONE:
        own = DistributedStrategy.DDP  # what several processes of the config as given run
    config = with_overrides(config, distributed(own, devices))
    given = estimate(config, kind, example_batch)
    rows, skipped = [], {}

    def plan_rows(candidates: list[tuple[str, Overrides]]) -> None:
        for name, overrides in candidates:
            why_not = _refusal(config, overrides)
            if why_not is not None:
                skipped[name] = why_not
                continue
            try:
                row = estimate(with_overrides(config, overrides), kind, example_batch)
            except MemfitError as error:  # e.g. no blocks to checkpoint in this model
                skipped[name] = str(error)
                continue
            except RuntimeError as error:  # an op the fake-tensor trace cannot run here
                skipped[name] = f"could not be traced ({str(error).splitlines()[0]})"
                continue
            fits = None if budget_bytes is None else row.device_bytes <= budget_bytes
            rows.append(StrategyEstimate(name, overrides, row, fits,
                                         step_time(row.work, profile)))

    candidates = _candidates(config, devices)
    plan_rows(candidates)
    split = widest_split(config.model, devices)
    if budget_bytes is not None and split > 1 and not any(row.fits for row in rows):
        plan_rows(split_rows(candidates, split))  # only where nothing else fits
    chosen, reason = None, NO_BUDGET
    if budget_bytes is not None:
        rows = with_fitted(config, rows, budget_bytes, kind, profile, example_batch)
        chosen, reason = choose(config, rows, budget_bytes, kind, profile, example_batch,
                                prefer, any_method)
    overrides = {**chosen.row.overrides, **chosen.micro_batch} if chosen else {}
    return Plan(budget_bytes, kind, devices, given, config.distributed.strategy.value, rows,
                skipped, chosen.row.name if chosen else None, overrides, reason, profile,
                step_time(given.work, profile), chosen.time if chosen else None,
                target.calibrated, device_label(device, profile))


NO_BUDGET = ("no budget given and no GPU here to take it from: every strategy's bytes, "
             "but what fits and which to use need a budget")


def device_assumed(device: str) -> bool:
    """True when the plan is for a device this machine does not have (cuda, no GPU)."""
    return device == "cuda" and not torch.cuda.is_available()


def device_label(device: str, profile: DeviceProfile | None = None) -> str:
    """The device a plan is for, as its header names it, with where its step times come
    from (``profile``)."""
    if device in BUILTIN:
        return f"{device} (builtin profile, no GPU of it here)"
    if device_assumed(device):
        times = (f"; step times of a {ASSUMED_GPU}, builtin: --device NAME for another"
                 if profile is not None else "")
        return (f"{device} (assumed: no GPU here; --device cpu to plan for this "
                f"machine{times})")
    if profile is not None:
        return f"{device} ({profile.name}, step times {profile.source})"
    return device


def default_budget(device: str) -> int | None:
    """The budget when none is given: the first GPU's memory when planning for ``cuda``
    where one is present (what ``memfit train`` would have), a builtin GPU's memory when
    one is named (``--device h100``), else None."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    if device in BUILTIN:
        return BUILTIN[device].memory_bytes
    return None


def _refusal(config: Config, overrides: Overrides) -> str | None:
    """Why the row ``overrides`` makes of ``config`` is not planned, if it is not."""
    if config.memory.auto_keep_adapters and overrides["adapter.kind"] == AdapterKind.NONE.value:
        return "memory.auto_keep_adapters=true keeps adapters"
    candidate = with_overrides(config, overrides)
    why_not = strategy_refusal(OptimizerSetting.of(candidate))
    if why_not is not None:
        return f"{candidate.distributed.strategy.value} cannot train it: {why_not}"
    return None


def distributed(strategy: DistributedStrategy, devices: int) -> Overrides:
    """The overrides that train as ``devices`` processes under ``strategy``."""
    return {"distributed.strategy": strategy.value, "distributed.nproc": devices}


def _candidates(config: Config, devices: int) -> list[tuple[str, Overrides]]:
    """(name, overrides) in order of preference. Over several devices each strategy of the
    ladder under ddp, then under fsdp: a more preferred method sharded comes before a less
    preferred one replicated (full-parameter training over adapters), and of one method
    data parallel first (it only all-reduces gradients; FSDP2 also gathers every weight in
    forward and in backward) — but for QLoRA, sharded first (``_sharded_first``)."""
    long_sequences = long_sequence_techniques_ok(config)
    if devices == 1:
        return strategies(*long_sequences)
    ordered = []
    for (name, replicated), (_, sharded) in zip(
            strategies(*long_sequences), strategies(*long_sequences, sharded=True),
            strict=True):
        pair = [(DistributedStrategy.DDP, replicated), (DistributedStrategy.FSDP, sharded)]
        if sharded_first(replicated):
            pair.reverse()
        ordered += [(f"{strategy.value}:{name}", {**overrides, **distributed(strategy, devices)})
                    for strategy, overrides in pair]
    return ordered


def recommend(config: Config, budget_bytes: int, device: str = "cuda",
              example_batch: ExampleBatch | None = None, devices: int | None = None,
              prefer: str = "quality") -> tuple[str, Overrides, str]:
    """(strategy name, config overrides, reason) for auto-fit; raises OutOfMemoryPlanError
    (exit status 2) when nothing fits."""
    result = plan(config, budget_bytes, device, example_batch, devices, prefer)
    if result.recommended is None:
        raise OutOfMemoryPlanError(result.reason)
    return result.recommended, result.recommended_overrides, result.reason


def refuse_if_too_large(config: Config, available_bytes: int, device: str) -> None:
    """Raise a ConfigError with the plan's numbers when training ``config`` as given
    cannot fit ``available_bytes`` (what ``memfit train`` checks for large presets)."""
    check_max_length(config.model, config.data.max_length)
    given = estimate(config, device)
    if given.device_bytes > available_bytes:
        name = config.model.preset or config.model.path or config.model.factory
        raise ConfigError(
            f"model.preset={name!r} needs {format_bytes(given.device_bytes)} to train as "
            f"configured ({itemized(given)}), but this machine has "
            f"{format_bytes(available_bytes)}; see `memfit plan` for strategies that fit")


def parse_budget(budget: str | int) -> int:
    try:
        value = parse_bytes(budget)
    except ValueError as error:
        raise ConfigError(f"--budget: {error}") from None
    check_bytes("--budget", value, budget)
    return value


def long_sequence_techniques_ok(config: Config) -> tuple[bool, bool, bool]:
    """(chunked loss, tiled MLP, tiled norms): whether the ladder's +ckpt levels can use
    them, for causal LMs: the chunked loss where the model's logits are the output layer's
    own, the tiled MLP and norms where it has MLP and norm modules."""
    if config.model.task is not Task.CAUSAL_LM or config.model.factory:
        return False, False, False
    model = meta.build(meta.BuildInputs.of(config, "cuda"), layers=1).model
    try:
        chunked_loss.check_supported(model)
        chunked_loss_ok = True
    except ConfigError:
        chunked_loss_ok = False  # e.g. Gemma-2's final logit soft-capping
    return chunked_loss_ok, bool(MLPS.modules(model)), bool(NORMS.modules(model))


def as_config(config: Config | dict[str, Any] | str | Path) -> Config:
    """A Config, a YAML-shaped mapping or a YAML path -> Config (planning checks only)."""
    if isinstance(config, Config):
        return config
    if isinstance(config, (str, Path)):
        return load_plan_config(config, [])
    return load_plan_config(None, [], base=config)


MODEL_SOURCES = ("path", "preset", "factory")


def load_plan_config(path: str | Path | None, overrides: list[str],
                     base: dict[str, Any] | None = None) -> Config:
    """YAML + key=value overrides -> Config, checked for what planning needs only (a model
    source); data.path and not-yet-trainable keys (qlora, galore, ...) may be planned.
    Without a file, a base or an override naming the model, the built-in demo is the base,
    as for ``memfit train``."""
    from memfit.config import load
    from memfit.demo.defaults import demo_config_path

    given = load.parse_overrides(overrides)
    model = given.get("model")
    names_model = isinstance(model, dict) and any(model.get(key) is not None
                                                  for key in MODEL_SOURCES)
    if path is None and base is None and not names_model:
        base = load.read_yaml(demo_config_path())
    raw = dict(base or {})
    if path is not None:
        raw = load.merge(raw, load.read_yaml(path))
    # load.build_unvalidated converts and type-checks every key but skips config.validate, whose
    # not-yet-supported list would refuse keys the planner must still plan.
    config = load.build_unvalidated(Config, load.merge(raw, given))
    # Numbers in range: a plan of 10**23 examples per micro-batch would never end. The
    # specs' own keys too, and each declared by one.
    check_numbers(config)
    check_own_keys(config.optimizer, config.memory, spec_for(config.optimizer))
    check_rope_scaling(config)  # a method and its factor together, on a model that can take it
    check_control_characters(config)
    sources = [key for key in MODEL_SOURCES if getattr(config.model, key)]
    if len(sources) != 1:
        raise ConfigError("set exactly one of model.path, model.preset, model.factory "
                          f"(got {', '.join('model.' + s for s in sources) or 'none'})")
    return config
