"""``memfit plan --max-length``: the longest ``data.max_length`` that fits a budget on one
device at the configured micro-batch, and the strategy that reaches it.

Candidates: the config as given, and each method of the ladder at its most frugal level
(``+offload``: checkpointing, chunked loss, tiled MLP, activations and, where it can,
optimizer state in host memory), which never needs more device bytes than that method's
other levels. A plan of every strategy at every length would take minutes for an 8B
model; instead:

1. every candidate is planned at a short length and at the model's context length: one
   that does not fit the short one never fits (the bytes grow with the length), and one
   that fits the context is the answer;
2. the others' bytes are close to affine in the length (flash attention, chunked loss and
   tiled MLP keep nothing quadratic), so a line through the two plans says where each
   crosses the budget, and the candidates predicted to reach within ``_CONTENDER`` of the
   best are searched exactly: regula falsi on (fitting, not fitting) brackets, with a
   bisection step whenever a step shrinks the bracket by less than half, down to one
   token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit._utils.errors import ConfigError, MemfitError
from memfit.config.schema import Config, Task
from memfit.plan.context import context_length
from memfit.plan.itemize import Estimate, estimate
from memfit.plan.planner import long_sequence_techniques_ok, parse_budget
from memfit.plan.strategies import METHODS, Overrides, levels, strategies, with_overrides

GIVEN = "config (as given)"
SHORT_LENGTH = 1024
_CONTENDER = 0.9  # searched exactly: predicted to reach 90% of the best prediction or more


@dataclass(frozen=True)
class LongestFit:
    budget_bytes: int
    device: str
    context: int  # the model's context length: the longest searched
    max_length: int | None  # None: not even SHORT_LENGTH tokens fit
    strategy: str | None
    overrides: Overrides  # the strategy's, plus data.max_length
    estimate: Estimate | None  # at max_length
    plans: int  # how many configurations were planned

    def to_json(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "device": self.device,
                "context": self.context, "max_length": self.max_length,
                "strategy": self.strategy, "overrides": self.overrides,
                "estimate": self.estimate.to_json() if self.estimate else None,
                "plans": self.plans}


def longest_fit(config: Config, budget: str | int, device: str = "cuda") -> LongestFit:
    budget_bytes = parse_budget(budget)
    if device not in ("cuda", "cpu"):
        raise ConfigError(f"device={device!r} is not one of: cuda, cpu")
    found = context_length(config) if config.model.task is Task.CAUSAL_LM else None
    if found is None:
        raise ConfigError("--max-length searches data.max_length of a causal LM given by "
                          "model.path or model.preset whose config names its context length")
    context = found[1]
    search = _Search(config, budget_bytes, device)
    short = min(SHORT_LENGTH, context)
    fitting = [name for name in search.names
               if search.fits(name, short) and search.bytes(name, context) is not None]
    at_context = [name for name in fitting if search.fits(name, context)]
    if at_context or not fitting:
        best = at_context[0] if at_context else None
        return search.result(best, context if best else None, context)
    predicted = {name: search.predicted_crossing(name, short, context) for name in fitting}
    top = max(predicted.values())
    reached = {name: search.longest(name, short, context) for name in fitting
               if predicted[name] >= _CONTENDER * top}
    longest = max(reached.values())
    best = next(name for name in search.names if reached.get(name) == longest)  # preferred
    return search.result(best, longest, context)


class _Search:
    """The candidates and every estimate made of them, by (name, length)."""

    def __init__(self, config: Config, budget_bytes: int, device: str):
        self.config, self.budget_bytes, self.device = config, budget_bytes, device
        frugal = levels(True, True)[-1][0]  # the ladder's last level's suffix: +offload
        ladder = strategies(*long_sequence_techniques_ok(config))
        methods = {method + frugal for method, _ in METHODS}
        self.overrides: dict[str, Overrides] = {GIVEN: {}, **{
            name: overrides for name, overrides in ladder if name in methods}}
        self.names = list(self.overrides)
        self._estimates: dict[tuple[str, int], Estimate | None] = {}

    def bytes(self, name: str, length: int) -> int | None:
        """Device bytes of ``name`` at ``length`` tokens; None: it cannot be planned."""
        key = (name, length)
        if key not in self._estimates:
            candidate = with_overrides(self.config, self._with_length(name, length))
            try:
                self._estimates[key] = estimate(candidate, self.device)
            except (MemfitError, RuntimeError):  # as plan() skips it (e.g. nothing to trace)
                self._estimates[key] = None
        found = self._estimates[key]
        return None if found is None else found.device_bytes

    def fits(self, name: str, length: int) -> bool:
        nbytes = self.bytes(name, length)
        return nbytes is not None and nbytes <= self.budget_bytes

    def predicted_crossing(self, name: str, short: int, long: int) -> float:
        """Where the line through the two plans meets the budget."""
        low, high = self.bytes(name, short), self.bytes(name, long)
        if high <= low:
            return float(long)
        return short + (self.budget_bytes - low) * (long - short) / (high - low)

    def longest(self, name: str, fitting: int, too_long: int) -> int:
        """The longest length that fits, ``fitting`` fitting and ``too_long`` not."""
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

    def result(self, name: str | None, length: int | None, context: int) -> LongestFit:
        if name is None or length is None:
            return LongestFit(self.budget_bytes, self.device, context, None, None, {}, None,
                              len(self._estimates))
        self.bytes(name, length)
        return LongestFit(self.budget_bytes, self.device, context, length, name,
                          self._with_length(name, length), self._estimates[(name, length)],
                          len(self._estimates))

    def _with_length(self, name: str, length: int) -> Overrides:
        return {**self.overrides[name], "data.max_length": length}
