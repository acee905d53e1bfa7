"""``plan``: every strategy's bytes, what fits a budget, the recommendation and why, and
the largest micro-batch that fits with the accumulation keeping the effective batch.

``recommend`` (auto-fit) and ``strategies.next_cheaper`` (OOM recovery) are what the
training side uses; ``refuse_if_too_large`` is the check ``memfit train`` makes before
building a model for real.

Without a budget every strategy is still planned; only what fits (and so the
recommendation) needs one, which defaults to the GPU's memory where one is present.
"""

from __future__ import annotations

import math
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
    check_int_limits,
)
from memfit.config.schema import AdapterKind, Config, DistributedStrategy, Task
from memfit.plan import meta
from memfit.plan.context import check_max_length
from memfit.plan.itemize import Estimate, ExampleBatch, estimate
from memfit.plan.strategies import Overrides, strategies, with_overrides
from memfit.techniques import chunked_loss, tiled_mlp
from memfit.techniques.distribution import strategy_for


@dataclass(frozen=True)
class StrategyEstimate:
    name: str  # the ladder strategy; over several devices prefixed "ddp:" or "fsdp:"
    overrides: Overrides  # over several devices with distributed.strategy and .nproc
    estimate: Estimate  # bytes on one device
    fits: bool | None  # None: no budget to fit

    @property
    def distributed(self) -> str:
        return self.overrides.get("distributed.strategy", DistributedStrategy.NONE.value)


@dataclass(frozen=True)
class Plan:
    budget_bytes: int | None  # per device; None: no budget given and no GPU to take it from
    device: str
    devices: int  # processes, one device each
    config: Estimate  # exactly the given configuration, under its own distributed.strategy
    config_distributed: str  # that strategy: none (one device), ddp or fsdp
    strategies: list[StrategyEstimate]  # in order of preference
    skipped: dict[str, str]  # strategy -> why it cannot be built for this model
    recommended: str | None
    recommended_overrides: Overrides  # the strategy's, plus the proposed micro-batch
    reason: str

    def to_json(self) -> dict[str, Any]:
        """The documented --json schema (docs/planner.md)."""
        return {
            "device": self.device,
            "device_assumed": device_assumed(self.device),
            "devices": self.devices,
            "config": {**self.config.to_json(), "distributed": self.config_distributed},
            "strategies": [{**s.estimate.to_json(), "name": s.name,
                            "distributed": s.distributed, "overrides": s.overrides,
                            "fits": s.fits} for s in self.strategies],
            "skipped": dict(self.skipped),
            "recommended": self.recommended,
            "reason": self.reason,
        }


def plan(config: Config, budget: str | int | None = None, device: str = "cuda",
         example_batch: ExampleBatch | None = None, devices: int | None = None) -> Plan:
    """Plan ``config`` against ``budget`` ("24GiB", bytes) on ``device`` ("cuda" adds the
    CUDA context and allocator slack; "cpu" counts tensors only, as the CPU tracker does).
    ``budget`` None: the GPU's memory when planning for cuda where a GPU is present (as
    ``default_budget``); without one, every strategy's bytes and no fits or recommendation.
    ``example_batch``: one micro-batch of inputs, needed for model.factory models.
    ``devices`` (default: distributed.nproc) > 1: bytes per device of training as that many
    processes, every strategy both under ddp (each holds the whole model) and under fsdp
    (sharded), with the micro-batch per device; what FSDP2 cannot train is skipped for
    fsdp, with the reason. The given config is planned under its own distributed.strategy
    (ddp when it names none). With memory.auto_keep_adapters only the strategies with
    adapters are planned and recommended (the others are skipped, with that reason)."""
    check_max_length(config)
    if device not in ("cuda", "cpu"):
        raise ConfigError(f"device={device!r} is not one of: cuda, cpu")
    budget_bytes = default_budget(device) if budget is None else parse_budget(budget)
    devices = config.distributed.nproc if devices is None else devices
    check_count("--devices", devices, 1, MAX_DEVICES)
    own = config.distributed.strategy
    if devices > 1 and own is DistributedStrategy.NONE:
        own = DistributedStrategy.DDP  # what several processes of the config as given run
    config = with_overrides(config, _distributed(own, devices))
    given = estimate(config, device, example_batch)
    rows, skipped = [], {}
    for name, overrides in _candidates(config, devices):
        if config.memory.auto_keep_adapters and overrides["adapter.kind"] == AdapterKind.NONE.value:
            skipped[name] = "memory.auto_keep_adapters=true keeps adapters"
            continue
        candidate = with_overrides(config, overrides)
        why_not = strategy_for(candidate).refusal(candidate)
        if why_not is not None:
            skipped[name] = f"{candidate.distributed.strategy.value} cannot train it: {why_not}"
            continue
        try:
            row = estimate(candidate, device, example_batch)
        except MemfitError as error:  # e.g. no blocks to checkpoint in this model
            skipped[name] = str(error)
            continue
        except RuntimeError as error:  # an op the fake-tensor trace cannot run here
            skipped[name] = f"could not be traced ({str(error).splitlines()[0]})"
            continue
        fits = None if budget_bytes is None else row.device_bytes <= budget_bytes
        rows.append(StrategyEstimate(name, overrides, row, fits))
    if budget_bytes is None:
        chosen, micro_batch, reason = None, {}, NO_BUDGET
    else:
        chosen, micro_batch, reason = _choose(config, rows, budget_bytes, device,
                                              example_batch)
    overrides = {**chosen.overrides, **micro_batch} if chosen else {}
    return Plan(budget_bytes, device, devices, given, config.distributed.strategy.value, rows,
                skipped, chosen.name if chosen else None, overrides, reason)


NO_BUDGET = ("no budget given and no GPU here to take it from: every strategy's bytes, "
             "but what fits and which to use need a budget")


def device_assumed(device: str) -> bool:
    """True when the plan is for a device this machine does not have (cuda, no GPU)."""
    return device == "cuda" and not torch.cuda.is_available()


def device_label(device: str) -> str:
    """The device a plan is for, as its header names it."""
    if device_assumed(device):
        return f"{device} (assumed: no GPU here; --device cpu to plan for this machine)"
    return device


def default_budget(device: str) -> int | None:
    """The budget when none is given: the first GPU's memory when planning for ``cuda``
    where one is present (what ``memfit train`` would have), else None."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    return None


def _distributed(strategy: DistributedStrategy, devices: int) -> Overrides:
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
        if _sharded_first(replicated):
            pair.reverse()
        ordered += [(f"{strategy.value}:{name}", {**overrides, **_distributed(strategy, devices)})
                    for strategy, overrides in pair]
    return ordered


def _sharded_first(overrides: Overrides) -> bool:
    """QLoRA: a replicated 4-bit base costs every device the whole base, while sharding it
    costs only the all-gather of 4-bit codes per block (a quarter of bf16 weights'
    traffic, against adapter gradients that are all-reduced either way); the bytes it
    frees go to a larger micro-batch. As FSDP+QLoRA (Answer.AI) does."""
    return overrides["adapter.kind"] == AdapterKind.QLORA.value


def recommend(config: Config, budget_bytes: int, device: str = "cuda",
              example_batch: ExampleBatch | None = None, devices: int | None = None
              ) -> tuple[str, Overrides, str]:
    """(strategy name, config overrides, reason) for auto-fit; raises OutOfMemoryPlanError
    (exit status 2) when nothing fits."""
    result = plan(config, budget_bytes, device, example_batch, devices)
    if result.recommended is None:
        raise OutOfMemoryPlanError(result.reason)
    return result.recommended, result.recommended_overrides, result.reason


def refuse_if_too_large(config: Config, available_bytes: int, device: str) -> None:
    """Raise a ConfigError with the plan's numbers when training ``config`` as given
    cannot fit ``available_bytes`` (what ``memfit train`` checks for large presets)."""
    check_max_length(config)
    given = estimate(config, device)
    if given.device_bytes > available_bytes:
        name = config.model.preset or config.model.path or config.model.factory
        raise ConfigError(
            f"model.preset={name!r} needs {format_bytes(given.device_bytes)} to train as "
            f"configured ({_itemized(given)}), but this machine has "
            f"{format_bytes(available_bytes)}; see `memfit plan` for strategies that fit")


def parse_budget(budget: str | int) -> int:
    try:
        value = parse_bytes(budget)
    except ValueError as error:
        raise ConfigError(f"--budget: {error}") from None
    check_bytes("--budget", value, budget)
    return value


def long_sequence_techniques_ok(config: Config) -> tuple[bool, bool]:
    """(chunked loss, tiled MLP): whether the ladder's +ckpt levels can use them, for
    causal LMs: the chunked loss where the model's logits are the output layer's own, the
    tiled MLP where it has MLP modules."""
    if config.model.task is not Task.CAUSAL_LM or config.model.factory:
        return False, False
    model = meta.build(config, layers=1).model
    try:
        chunked_loss.check_supported(model)
        chunked_loss_ok = True
    except ConfigError:
        chunked_loss_ok = False  # e.g. Gemma-2's final logit soft-capping
    return chunked_loss_ok, bool(tiled_mlp.mlp_modules(model))


def _choose(config: Config, rows: list[StrategyEstimate], budget: int, device: str,
            example_batch: ExampleBatch | None
            ) -> tuple[StrategyEstimate | None, Overrides, str]:
    """The first strategy in preference order that fits at some micro-batch."""
    for row in rows:
        micro = _largest_micro_batch(config, row, budget, device, example_batch)
        if micro is None:
            continue
        size, steps = micro["train.micro_batch_size"], micro["train.gradient_accumulation_steps"]
        needs = estimate(with_overrides(config, {**row.overrides, **micro}), device,
                         example_batch)
        why = (f"{_why_this_one(row, rows, budget)}; largest micro-batch that fits: {size} x "
               f"{steps} accumulation steps (needs {format_bytes(needs.device_bytes)}: "
               f"{_itemized(needs)})")
        return row, micro, why
    smallest = min(rows, key=lambda r: r.estimate.device_bytes, default=None)
    lowest = (f"; the smallest, {smallest.name} at micro-batch "
              f"{smallest.estimate.micro_batch_size}, needs "
              f"{format_bytes(smallest.estimate.device_bytes)}" if smallest else "")
    return None, {}, f"no strategy fits {format_bytes(budget)} even at micro-batch 1{lowest}"


def _why_this_one(row: StrategyEstimate, rows: list[StrategyEstimate], budget: int) -> str:
    """Why ``row``, the first that fits: nothing preferred before it fits (the one just
    before, under the same distributed.strategy, and what it needs); over several devices,
    why data parallel or why FSDP."""
    same = [r for r in rows if r.distributed == row.distributed]
    why = f"{row.name} is the most preferred strategy that fits {format_bytes(budget)}"
    position = same.index(row)
    if position:
        before = same[position - 1]
        why += (f" (the one preferred before it, {before.name}, needs "
                f"{format_bytes(before.estimate.device_bytes)})")
    if row.distributed == DistributedStrategy.DDP.value:
        return ("data parallel (ddp): the model trains within one device's budget, so every "
                "process holds it whole and only gradients are all-reduced, with no weight "
                "gathered per block as FSDP2 would; " + why)
    if row.distributed == DistributedStrategy.FSDP.value and _sharded_first(row.overrides):
        return ("FSDP2 (fsdp): QLoRA shards its 4-bit base before replicating it (each "
                "process holds 1/N of the base and gathers a block's 4-bit codes to run it; "
                "the bytes this frees go to the micro-batch); " + why)
    if row.distributed == DistributedStrategy.FSDP.value:
        method = row.name.partition(":")[2]
        replicated = next((r for r in rows if r.name == f"ddp:{method}"), None)
        needs = (f" (ddp:{method} needs {format_bytes(replicated.estimate.device_bytes)} per "
                 "device)" if replicated else "")
        return (f"FSDP2 (fsdp): {method} does not fit one device under data parallel{needs}, "
                "so weights, gradients and optimizer state are sharded over the processes; "
                + why)
    return why


def _largest_micro_batch(config: Config, row: StrategyEstimate, budget: int, device: str,
                         example_batch: ExampleBatch | None) -> Overrides | None:
    """Largest divisor b of the effective batch whose estimate fits, with effective / b
    accumulation steps: a binary search over the divisors, whose bytes grow with b."""
    if example_batch is not None:  # a factory's example fixes the micro-batch
        return _micro(config.train.micro_batch_size, config) if row.fits else None
    divisors = _divisors(config.train.micro_batch_size * config.train.gradient_accumulation_steps)

    def fits(size: int) -> bool:
        if size == config.train.micro_batch_size:
            return row.fits
        candidate = with_overrides(config, {**row.overrides, **_micro(size, config)})
        return estimate(candidate, device).device_bytes <= budget

    low, high, best = 0, len(divisors) - 1, None
    while low <= high:
        middle = (low + high) // 2
        if fits(divisors[middle]):
            best, low = _micro(divisors[middle], config), middle + 1
        else:
            high = middle - 1
    return best


def _divisors(number: int) -> list[int]:
    """The divisors of ``number`` in increasing order, by trial division up to its square
    root (the effective batch may be up to 2**40: counting up to it would hang)."""
    small = [d for d in range(1, math.isqrt(number) + 1) if number % d == 0]
    return small + [number // d for d in reversed(small) if d * d != number]


def _micro(size: int, config: Config) -> Overrides:
    effective = config.train.micro_batch_size * config.train.gradient_accumulation_steps
    return {"train.micro_batch_size": size, "train.gradient_accumulation_steps": effective // size}


def _itemized(row: Estimate) -> str:
    parts = [f"{name} {format_bytes(value)}" for name, value in row.bytes.items() if value]
    if row.device_overhead_bytes:
        parts.append(f"overhead {format_bytes(row.device_overhead_bytes)}")
    return ", ".join(parts)


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
    check_int_limits(config)  # a plan of 10**23 examples per micro-batch would never end
    check_control_characters(config)
    sources = [key for key in MODEL_SOURCES if getattr(config.model, key)]
    if len(sources) != 1:
        raise ConfigError("set exactly one of model.path, model.preset, model.factory "
                          f"(got {', '.join('model.' + s for s in sources) or 'none'})")
    return config
