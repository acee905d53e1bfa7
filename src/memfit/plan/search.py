"""Each method's fastest partial level that fits a budget: its ``+fit`` row.

The named levels are all or nothing (plain, every block checkpointed, every activation
offloaded). Between two of them lies a partial level that can be the fastest that fits:
checkpointing only the first N blocks (``memory.checkpoint_blocks``) recomputes only
those, and with every block checkpointed, offloading only the first N blocks' inputs
(``memory.offload_blocks``) copies only theirs. The bytes fall and the time rises with N,
so the fastest that fits is the smallest N that fits: a binary search over N between the
level that does not fit and the next one that does, at the configured micro-batch (the
choice then tries larger micro-batches of the row, choose.py). Only Hugging Face models
with more than one block are searched; their stand-ins of each kind of block are traced
once (itemize.py), so each N costs a sum, not a trace.
"""

from __future__ import annotations

from collections.abc import Callable

from memfit._utils.errors import MemfitError
from memfit.config.overrides import with_overrides
from memfit.config.schema import Config
from memfit.plan import meta
from memfit.plan.choose import StrategyEstimate
from memfit.plan.devices import DeviceProfile
from memfit.plan.itemize import ExampleBatch, estimate
from memfit.plan.step_time import step_time
from memfit.plan.strategies import FIT, LEVELS

_OFFLOADED = LEVELS[-1]


def with_fitted(config: Config, rows: list[StrategyEstimate], budget: int, device: str,
                profile: DeviceProfile, example_batch: ExampleBatch | None
                ) -> list[StrategyEstimate]:
    """``rows`` with each method's ``+fit`` row after its named levels, where one lies
    between a level that does not fit and the next that does."""
    transformers_config = meta.hf_config(config.model)
    depth = None if transformers_config is None else meta.depth(transformers_config)
    if example_batch is not None or depth is None or depth < 2:
        return rows
    by_name = {row.name: row for row in rows}
    out: list[StrategyEstimate] = []
    for row in rows:
        out.append(row)
        if not row.name.endswith(_OFFLOADED):
            continue
        base = row.name[: -len(_OFFLOADED)]
        levels = [by_name.get(base + suffix) for suffix in LEVELS]
        fitted = _fitted(config, base, levels, depth, budget, device, profile)
        if fitted is not None:
            out.append(fitted)
    return out


def _fitted(config: Config, base: str, levels: list[StrategyEstimate | None], depth: int,
            budget: int, device: str, profile: DeviceProfile) -> StrategyEstimate | None:
    plain, checkpointed, offloaded = levels
    if plain is None or checkpointed is None or plain.fits:
        return None
    if checkpointed.fits:  # some blocks plain, the first N recomputed
        partial = {**checkpointed.overrides}
        key = "memory.checkpoint_blocks"
    elif offloaded is not None and offloaded.fits:  # all recomputed, the first N offloaded
        partial = {**checkpointed.overrides, "memory.activation_offload": True}
        key = "memory.offload_blocks"
    else:
        return None

    def planned(blocks: int) -> StrategyEstimate | None:
        overrides = {**partial, key: blocks}
        try:
            needs = estimate(with_overrides(config, overrides), device)
        except MemfitError:
            return None
        return StrategyEstimate(base + FIT, overrides, needs, needs.device_bytes <= budget,
                                step_time(needs.work, profile))

    return _smallest(1, depth - 1 if key == "memory.checkpoint_blocks" else depth, planned)


def _smallest(low: int, high: int, planned: Callable[[int], StrategyEstimate | None]
              ) -> StrategyEstimate | None:
    """The row of the smallest N in [low, high] that fits (fitting grows with N)."""
    best = None
    while low <= high:
        middle = (low + high) // 2
        row = planned(middle)
        if row is not None and row.fits:
            best, high = row, middle - 1
        else:
            low = middle + 1
    return best

