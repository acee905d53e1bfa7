"""Which planned strategy to use for a budget, and why (``choose``), by ``prefer``:

- ``quality`` (default): the most preferred *method* that fits (strategies.py's order:
  full-parameter training before adapters, QLoRA last), and within it its fastest mix
  (its levels, each at the configured micro-batch or the largest that fits);
- ``speed``: the fastest row that fits among the methods of the config's own adapter kind
  (full-parameter, LoRA or QLoRA), or among every method (``any_method``).

A row's mix keeps the effective batch: a larger micro-batch comes with fewer accumulation
steps. The reason names the predicted step time and how much slower the choice is than
the fastest row that fits as planned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memfit._utils.errors import ConfigError
from memfit._utils.sizes import format_bytes
from memfit.config.overrides import Overrides, with_overrides
from memfit.config.schema import AdapterKind, Config, DistributedStrategy, TrainConfig
from memfit.plan.devices import DeviceProfile
from memfit.plan.itemize import Estimate, ExampleBatch, estimate
from memfit.plan.step_time import StepTime, step_time
from memfit.plan.strategies import FIT, LEVELS

PREFERENCES = ("quality", "speed")


@dataclass(frozen=True)
class StrategyEstimate:
    """One planned strategy: a row of the plan's table."""

    name: str  # the ladder strategy ("lora+ckpt"); over several devices "ddp:lora+ckpt"
    overrides: Overrides  # over several devices with distributed.strategy and .nproc
    estimate: Estimate  # bytes on one device
    fits: bool | None  # None: no budget to fit
    time: StepTime  # predicted, at the configured micro-batch

    @property
    def distributed(self) -> str:
        return self.overrides.get("distributed.strategy", DistributedStrategy.NONE.value)

    @property
    def method(self) -> str:
        """The name without its distribution and level: the rows of one method differ only
        in how they save memory and how they spread over the devices."""
        name = self.name.partition(":")[2] or self.name
        for suffix in sorted((*LEVELS, FIT), key=len, reverse=True):
            if suffix and name.endswith(suffix):
                return name[: -len(suffix)]
        return name


@dataclass(frozen=True)
class Choice:
    row: StrategyEstimate
    micro_batch: Overrides  # train.micro_batch_size and the accumulation keeping the batch
    needs: Estimate  # at that micro-batch
    time: StepTime


def check_preference(prefer: str) -> None:
    if prefer not in PREFERENCES:
        raise ConfigError(f"--prefer {prefer!r} is not one of: {', '.join(PREFERENCES)}")


def choose(config: Config, rows: list[StrategyEstimate], budget: int, device: str,
           profile: DeviceProfile, example_batch: ExampleBatch | None,
           prefer: str = "quality", any_method: bool = False) -> tuple[Choice | None, str]:
    """(the choice, why) or (None, why nothing fits); see the module docstring."""
    def fastest(candidates: list[StrategyEstimate]) -> Choice | None:
        choices = [c for row in candidates
                   for c in _mixes(config, row, budget, device, profile, example_batch)]
        return min(choices, key=lambda c: c.time.seconds, default=None)

    chosen = None
    if prefer == "speed":
        kind = config.adapter.kind.value
        chosen = fastest([r for r in rows
                          if any_method or r.overrides["adapter.kind"] == kind])
        if chosen is None and not any_method:
            return None, (f"no strategy with adapter.kind={kind} fits {format_bytes(budget)}; "
                          "--any-method lets --prefer speed take any method")
    else:
        for method in dict.fromkeys(row.method for row in rows):
            chosen = fastest([r for r in rows if r.method == method])
            if chosen is not None:
                break
    if chosen is None:
        smallest = min(rows, key=lambda r: r.estimate.device_bytes, default=None)
        lowest = (f"; the smallest, {smallest.name} at micro-batch "
                  f"{smallest.estimate.micro_batch_size}, needs "
                  f"{format_bytes(smallest.estimate.device_bytes)}" if smallest else "")
        return None, f"no strategy fits {format_bytes(budget)} even at micro-batch 1{lowest}"
    size = chosen.micro_batch["train.micro_batch_size"]
    steps = chosen.micro_batch["train.gradient_accumulation_steps"]
    why = (f"{_why_this_one(chosen.row, rows, budget, prefer)}; micro-batch {size} x {steps} "
           f"accumulation steps (needs {format_bytes(chosen.needs.device_bytes)}: "
           f"{itemized(chosen.needs)}); {_time_line(chosen, rows)}")
    return chosen, why


def _mixes(config: Config, row: StrategyEstimate, budget: int, device: str, profile: DeviceProfile,
           example_batch: ExampleBatch | None) -> list[Choice]:
    """``row`` at the configured micro-batch (where it fits) and at the largest that fits."""
    mixes = []
    if row.fits:
        mixes.append(Choice(row, _micro(config.train.micro_batch_size, config.train), row.estimate,
                            row.time))
    largest = _largest_micro_batch(config, row, budget, device, example_batch)
    if largest is not None and largest["train.micro_batch_size"] != config.train.micro_batch_size:
        needs = estimate(with_overrides(config, {**row.overrides, **largest}), device,
                         example_batch)
        mixes.append(Choice(row, largest, needs, step_time(needs.work, profile)))
    return mixes


def _time_line(chosen: Choice, rows: list[StrategyEstimate]) -> str:
    """Its predicted step time against the fastest row that fits as planned."""
    line = f"predicted {format_seconds(chosen.time.seconds)} per optimizer step"
    fitting = [r for r in rows if r.fits]
    if not fitting:
        return line
    best = min(fitting, key=lambda r: r.time.seconds)
    slower = chosen.time.seconds / best.time.seconds - 1
    if slower <= 0.005:
        return line + ", the fastest of the rows that fit"
    return (line + f", {slower:.0%} slower than the fastest row that fits ({best.name}, "
            f"{format_seconds(best.time.seconds)} at micro-batch "
            f"{best.estimate.micro_batch_size})")


def format_seconds(seconds: float) -> str:
    if seconds >= 100:
        return f"{seconds:,.0f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def sharded_first(overrides: Overrides) -> bool:
    """QLoRA: a replicated 4-bit base costs every device the whole base, while sharding it
    costs only the all-gather of 4-bit codes per block (a quarter of bf16 weights'
    traffic, against adapter gradients that are all-reduced either way); the bytes it
    frees go to a larger micro-batch. As FSDP+QLoRA (Answer.AI) does."""
    return overrides["adapter.kind"] == AdapterKind.QLORA.value


def _why_this_one(row: StrategyEstimate, rows: list[StrategyEstimate], budget: int,
                  prefer: str) -> str:
    """Why ``row``: the preference and what the rows before it need; over several
    devices, why data parallel or why FSDP."""
    if prefer == "speed":
        why = f"{row.name} is the fastest strategy that fits {format_bytes(budget)}"
    else:
        same = [r for r in rows if r.distributed == row.distributed]
        why = (f"{row.method} is the most preferred method that fits {format_bytes(budget)}, "
               f"and {row.name} its fastest mix")
        earlier = [r for r in same[:same.index(row)] if r.method != row.method]
        if earlier:
            before = earlier[-1]
            why += (f" (the one preferred before it, {before.name}, needs "
                    f"{format_bytes(before.estimate.device_bytes)})")
    if row.distributed == DistributedStrategy.DDP.value:
        return ("data parallel (ddp): the model trains within one device's budget, so every "
                "process holds it whole and only gradients are all-reduced, with no weight "
                "gathered per block as FSDP2 would; " + why)
    if row.distributed == DistributedStrategy.FSDP.value and sharded_first(row.overrides):
        return ("FSDP2 (fsdp): QLoRA shards its 4-bit base before replicating it (each "
                "process holds 1/N of the base and gathers a block's 4-bit codes to run it; "
                "the bytes this frees go to the micro-batch); " + why)
    if row.distributed == DistributedStrategy.FSDP.value:
        mix = row.name.partition(":")[2]
        replicated = next((r for r in rows if r.name == f"ddp:{mix}"), None)
        if replicated is not None and replicated.fits:
            return (f"FSDP2 (fsdp): {mix} sharded is predicted faster than data parallel, "
                    f"where it fits too (ddp:{mix}: "
                    f"{format_seconds(replicated.time.seconds)} per step); " + why)
        needs = (f" (ddp:{mix} needs {format_bytes(replicated.estimate.device_bytes)} per "
                 "device)" if replicated else "")
        return (f"FSDP2 (fsdp): {mix} does not fit one device under data parallel{needs}, "
                "so weights, gradients and optimizer state are sharded over the processes; "
                + why)
    return why


def _largest_micro_batch(config: Config, row: StrategyEstimate, budget: int, device: str,
                         example_batch: ExampleBatch | None) -> Overrides | None:
    """Largest divisor b of the effective batch whose estimate fits, with effective / b
    accumulation steps: a binary search over the divisors, whose bytes grow with b."""
    if example_batch is not None:  # a factory's example fixes the micro-batch
        return _micro(config.train.micro_batch_size, config.train) if row.fits else None
    divisors = _divisors(config.train.micro_batch_size * config.train.gradient_accumulation_steps)

    def fits(size: int) -> bool:
        if size == config.train.micro_batch_size:
            return bool(row.fits)
        candidate = with_overrides(config, {**row.overrides, **_micro(size, config.train)})
        return estimate(candidate, device).device_bytes <= budget

    low, high, best = 0, len(divisors) - 1, None
    while low <= high:
        middle = (low + high) // 2
        if fits(divisors[middle]):
            best, low = _micro(divisors[middle], config.train), middle + 1
        else:
            high = middle - 1
    return best


def _divisors(number: int) -> list[int]:
    """The divisors of ``number`` in increasing order, by trial division up to its square
    root (the effective batch may be up to 2**40: counting up to it would hang)."""
    small = [d for d in range(1, math.isqrt(number) + 1) if number % d == 0]
    return small + [number // d for d in reversed(small) if d * d != number]


def _micro(size: int, train: TrainConfig) -> Overrides:
    """Micro-batch ``size`` with the accumulation that keeps train's effective batch."""
    effective = train.micro_batch_size * train.gradient_accumulation_steps
    return {"train.micro_batch_size": size, "train.gradient_accumulation_steps": effective // size}


def itemized(row: Estimate) -> str:
    parts = [f"{name} {format_bytes(value)}" for name, value in row.bytes.items() if value]
    if row.device_overhead_bytes:
        parts.append(f"overhead {format_bytes(row.device_overhead_bytes)}")
    return ", ".join(parts)
