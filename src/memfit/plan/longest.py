"""``memfit plan --max-length``: the longest ``data.max_length`` that fits a budget on each
of ``--devices`` devices at the configured micro-batch, and the strategy that reaches it.

Candidates: the config as given, and each method of the ladder at its most frugal level
(``+offload``: checkpointing, chunked loss, tiled MLP and norms, activations and, where it can,
optimizer state in host memory), which never needs more device bytes than that method's
other levels. Over several devices, each method sharded (fsdp: the weights, gradients
and state divided, which a long sequence's replicas under ddp are not) and sharded with
each sequence split over the most devices the model's heads allow (``fsdp-spN``:
sequence_rows.py). A plan of every strategy at every length would take minutes for an 8B
model; instead:

1. every candidate is planned at a short length (``SHORT_LENGTH``): one that does not fit
   it fits no longer one (the bytes grow with the length); when none fits, the search
   runs between ``MIN_LENGTH`` and it instead;
2. the others at ``ANCHOR_LENGTH`` and twice that, longer than one chunk of the tiled
   MLP and of the loss, so that every tensor still growing with the length grows
   linearly (flash attention, chunked loss and tiled MLP keep nothing quadratic): the
   line through these two plans says where each candidate crosses the budget (Llama-3.1-8B
   QLoRA +offload grows by 0.181 GiB per 1,000 tokens from 16,384 tokens to 131,072, and
   by 0.098 below 16,384, where the peak is another moment);
3. the candidates predicted to reach within ``_CONTENDER`` of the best are searched
   exactly (and then those predicted within it of the longest reached, until none is
   left: a line through short plans can overshoot, Llama-3.1-8B full-parameter GaLore's
   by a third at 80 GiB), the one predicted furthest first; each next one is planned at
   the longest reached so far, and searched on from there only if it fits it. A search
   starts from the predicted crossing: out to the first length that does not fit (or
   the context length), then regula falsi on the (fitting, not fitting) bracket, with a
   bisection step whenever a step shrinks the bracket by less than half, down to one
   token. Only these plans are of long sequences, whose traces take longest (a trace's
   time grows with the chunks it runs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from memfit._utils.errors import ConfigError, MemfitError
from memfit.config.limits import MAX_DEVICES, check_count
from memfit.config.overrides import Overrides, with_overrides
from memfit.config.schema import Config, DistributedStrategy, Task
from memfit.plan.context import beyond_context, context_length
from memfit.plan.itemize import Estimate, estimate
from memfit.plan.planner import (
    device_assumed,
    distributed,
    long_sequence_techniques_ok,
    parse_budget,
)
from memfit.plan.sequence_rows import split_rows, widest_split
from memfit.plan.strategies import METHODS, levels, strategies
from memfit.techniques.distribution import strategy_refusal
from memfit.techniques.optimizers.setting import OptimizerSetting

GIVEN = "config (as given)"
SHORT_LENGTH = 1024
MIN_LENGTH = 2  # a token and the next one it predicts
ANCHOR_LENGTH = 16384
_CONTENDER = 0.9  # searched exactly: predicted to reach 90% of the best prediction or more


@dataclass(frozen=True)
class LongestFit:
    budget_bytes: int  # per device
    device: str
    devices: int
    context: int  # the model's context length: the longest searched
    max_length: int | None  # None: not even MIN_LENGTH tokens fit
    strategy: str | None
    overrides: Overrides  # the strategy's, plus data.max_length
    estimate: Estimate | None  # at max_length
    plans: int  # how many configurations were planned
    # The search stopped at the context of a RoPE model without model.rope_scaling: the
    # overrides that extend it.
    beyond: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "device": self.device,
                "device_assumed": device_assumed(self.device), "devices": self.devices,
                "context": self.context, "max_length": self.max_length,
                "strategy": self.strategy, "overrides": self.overrides,
                "estimate": self.estimate.to_json() if self.estimate else None,
                "plans": self.plans, "beyond": self.beyond}


def longest_fit(config: Config, budget: str | int, device: str = "cuda", devices: int = 1
                ) -> LongestFit:
    """The longest data.max_length of ``config`` that some candidate fits in ``budget`` on
    each of ``devices`` ``device``s (see the module docstring); ConfigError for a model
    without a context length (a factory, a classifier)."""
    budget_bytes = parse_budget(budget)
    if device not in ("cuda", "cpu"):
        raise ConfigError(f"device={device!r} is not one of: cuda, cpu")
    check_count("--devices", devices, 1, MAX_DEVICES)
    found = context_length(config.model) if config.model.task is Task.CAUSAL_LM else None
    if found is None:
        raise ConfigError("--max-length searches data.max_length of a causal LM given by "
                          "model.path or model.preset whose config names its context length")
    context = found[1]
    search = _Search(config, budget_bytes, device, devices)
    short = min(SHORT_LENGTH, context)
    line = sorted({short, min(ANCHOR_LENGTH, context), min(2 * ANCHOR_LENGTH, context)})[-2:]
    fitting = [name for name in search.names if search.fits(name, short)
               and all(search.bytes(name, length) is not None for length in line)]
    shortest = short
    if not fitting:  # the longest is below the short length, if anything fits
        shortest, line = MIN_LENGTH, [MIN_LENGTH, short]
        fitting = [name for name in search.names if search.fits(name, MIN_LENGTH)
                   and search.bytes(name, short) is not None]
    if not fitting:
        return search.result(None, None, context)
    # Capped at the context: candidates all predicted past it tie there, and the preferred
    # one (the config as given first) is searched rather than the one predicted furthest.
    predicted = {name: min(search.predicted_crossing(name, *line), context) if len(line) == 2
                 else float(context) for name in fitting}
    threshold = _CONTENDER * max(predicted.values())
    reached: dict[str, int] = {}  # each searched candidate's longest
    shorter: set[str] = set()  # does not fit the longest reached before its turn
    while contenders := sorted((name for name in fitting if name not in reached
                                and name not in shorter and predicted[name] >= threshold),
                               key=lambda name: -predicted[name]):
        for name in contenders:
            longest = max(reached.values(), default=shortest)
            if search.fits(name, longest):  # from there: only a longer one is news
                reached[name] = search.longest(name, longest, predicted[name], context)
            else:
                shorter.add(name)
        threshold = min(threshold, _CONTENDER * max(reached.values()))
    longest = max(reached.values())
    best = next(name for name in search.names if reached.get(name) == longest)  # preferred
    found = search.result(best, longest, context)
    return replace(found, beyond=beyond_context(config.model)) if longest == context else found


class _Search:
    """The candidates and every estimate made of them, by (name, length)."""

    def __init__(self, config: Config, budget_bytes: int, device: str, devices: int):
        self.budget_bytes, self.device = budget_bytes, device
        frugal = levels(True, True)[-1][0]  # the ladder's last level's suffix: +offload
        ladder = strategies(*long_sequence_techniques_ok(config), sharded=devices > 1)
        methods = {method + frugal for method, _ in METHODS}
        candidates = [(name, overrides) for name, overrides in ladder if name in methods]
        if devices > 1:  # as plan() plans several processes: the config under its own
            # strategy (ddp when it names none), the methods sharded, then split too
            own = config.distributed.strategy
            config = with_overrides(config, distributed(
                DistributedStrategy.DDP if own is DistributedStrategy.NONE else own, devices))
            fsdp = DistributedStrategy.FSDP
            candidates = [(f"{fsdp.value}:{name}", {**overrides, **distributed(fsdp, devices)})
                          for name, overrides in candidates]
            split = widest_split(config.model, devices)
            candidates += split_rows(candidates, split) if split > 1 else []
        self.config, self.devices = config, devices
        self.overrides: dict[str, Overrides] = {GIVEN: {}, **dict(candidates)}
        self.names = list(self.overrides)
        self._estimates: dict[tuple[str, int], Estimate | None] = {}

    def bytes(self, name: str, length: int) -> int | None:
        """Device bytes of ``name`` at ``length`` tokens; None: it cannot be planned."""
        key = (name, length)
        if key not in self._estimates:
            candidate = with_overrides(self.config, self._with_length(name, length))
            try:
                refused = strategy_refusal(OptimizerSetting.of(candidate)) is not None
                self._estimates[key] = None if refused else estimate(candidate, self.device)
            except (MemfitError, RuntimeError):  # as plan() skips it (e.g. nothing to trace)
                self._estimates[key] = None
        found = self._estimates[key]
        return None if found is None else found.device_bytes

    def fits(self, name: str, length: int) -> bool:
        nbytes = self.bytes(name, length)
        return nbytes is not None and nbytes <= self.budget_bytes

    def predicted_crossing(self, name: str, shorter: int, longer: int) -> float:
        """Where the line through the plans at ``shorter`` and ``longer`` meets the budget."""
        low, high = self.bytes(name, shorter), self.bytes(name, longer)
        if high <= low:
            return float("inf")  # no growth seen: as long as the context allows
        return shorter + (self.budget_bytes - low) * (longer - shorter) / (high - low)

    def longest(self, name: str, fitting: int, predicted: float, context: int) -> int:
        """The longest length up to ``context`` that fits, given that ``fitting`` fits and
        the crossing is predicted at ``predicted``."""
        too_long = next((length for length in sorted(self._lengths(name))
                         if length > fitting and not self.fits(name, length)), None)
        guess = min(context, max(fitting + 1, int(predicted)))
        step = max(1, guess // 64)
        while too_long is None:  # out from the prediction to a length that does not fit
            if self.fits(name, guess):
                fitting = guess
                if guess == context:
                    return context
                guess, step = min(context, guess + step), 2 * step
            else:
                too_long = guess
        while too_long - fitting > 1:
            width = too_long - fitting
            low, high = self.bytes(name, fitting), self.bytes(name, too_long)
            guess = fitting + int((self.budget_bytes - low) * width / max(high - low, 1))
            guess = min(max(guess, fitting + 1), too_long - 1)
            if self.fits(name, guess):
                fitting = guess
            else:
                too_long = guess
            if too_long - fitting > width // 2:  # a slow step: halve the bracket
                middle = (fitting + too_long) // 2
                if self.fits(name, middle):
                    fitting = middle
                else:
                    too_long = middle
        return fitting

    def _lengths(self, name: str) -> list[int]:
        return [length for planned, length in self._estimates if planned == name]

    def result(self, name: str | None, length: int | None, context: int) -> LongestFit:
        if name is None or length is None:
            return LongestFit(self.budget_bytes, self.device, self.devices, context, None,
                              None, {}, None, len(self._estimates))
        self.bytes(name, length)
        return LongestFit(self.budget_bytes, self.device, self.devices, context, length, name,
                          self._with_length(name, length), self._estimates[(name, length)],
                          len(self._estimates))

    def _with_length(self, name: str, length: int) -> Overrides:
        return {**self.overrides[name], "data.max_length": length}
