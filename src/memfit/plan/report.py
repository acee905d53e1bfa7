"""``memfit plan``'s table: one row per strategy, bytes in binary units; and the line of
``memfit plan --max-length``."""

from __future__ import annotations

from memfit._utils.sizes import format_bytes
from memfit.accounting import CATEGORIES
from memfit.config.choices import TOKEN_FORMATS
from memfit.config.overrides import differing
from memfit.config.schema import Config, DataConfig, DataFormat
from memfit.plan.choose import format_seconds
from memfit.plan.itemize import Estimate
from memfit.plan.longest import MIN_LENGTH, LongestFit
from memfit.plan.planner import Plan, device_label
from memfit.plan.step_time import StepTime

_COLUMNS = (*CATEGORIES, "peak", "+overhead", "host", "step", "tok/s")


def _cells(row: Estimate, time: StepTime) -> list[str]:
    values = [*(row.bytes[name] for name in CATEGORIES), row.peak_tensor_bytes,
              row.device_bytes, row.host_bytes]
    speed = time.tokens_per_second
    return [*(format_bytes(value) if value else "-" for value in values),
            format_seconds(time.seconds), "-" if speed is None else f"{speed:,.0f}"]


def _micro_batch(size: int, data: DataConfig) -> str:
    """A micro-batch of ``size`` in the data's own units: tokens, images or examples."""
    if data.format in TOKEN_FORMATS:
        return f"{size} x {data.max_length} tokens"
    if data.format is DataFormat.CLASSIFICATION:
        return f"{size} texts of up to {data.max_length} tokens"
    if data.format is DataFormat.IMAGES:
        side = data.images.size
        return f"{size} images" + (f" of {side}x{side}" if side else "")
    return f"{size} examples"


def format_plan(result: Plan, config: Config) -> str:
    model = config.model.preset or config.model.path or config.model.factory
    devices = (f", {result.devices} devices (bytes per device; ddp: each holds the whole "
               "model, fsdp: sharded)" if result.devices > 1 else "")
    budget = result.budget_bytes
    micro_batch = _micro_batch(config.train.micro_batch_size, config.data)
    lines = [f"memfit plan: {model}, micro-batch {micro_batch}, "
             f"{config.train.gradient_accumulation_steps} accumulation steps, "
             f"{'no budget' if budget is None else 'budget ' + format_bytes(budget)}, "
             f"for {result.label}{devices}", ""]
    # Without a budget there is nothing to fit: no "fits" column.
    fits = [] if budget is None else ["fits"]
    header = ["strategy", *_COLUMNS, *fits, "peak at"]
    given = ("config (as given)" if result.devices == 1
             else f"config (as given, {result.config_distributed})")
    rows = [[given, *_cells(result.config, result.config_time),
             *(["yes" if result.config.device_bytes <= budget else "no"] if fits else []),
             result.config.peak_moment.name]]
    for strategy in result.strategies:
        mark = "yes" if strategy.fits else "no"
        if strategy.name == result.recommended:
            size = result.recommended_overrides["train.micro_batch_size"]
            mark = ("yes" if strategy.fits else f"at micro-batch {size}") + " <- recommended"
        rows.append([strategy.name, *_cells(strategy.estimate, strategy.time),
                     *([mark] if fits else []),
                     strategy.estimate.peak_moment.name])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        # Names, the fits mark and the moment left; bytes right.
        left = (0, len(row) - 2, len(row) - 1) if fits else (0, len(row) - 1)
        cells = [cell.ljust(width) if i in left else cell.rjust(width)
                 for i, (cell, width) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    lines.append("")
    moment = result.config.peak_moment
    lines.append(f"{given} peaks at the {moment.name}: {moment.why}")
    for why, names in _by_reason(result.skipped).items():
        lines.append(f"not planned: {', '.join(names)}: {why}")
    if budget is None:
        lines.append("what fits: give --budget (e.g. --budget 24GiB) to mark what fits and "
                     "get a recommendation")
    else:
        lines.append(f"recommended: {result.recommended or 'none'}: {result.reason}")
    if changes := differing(config, result.recommended_overrides):
        lines.append("apply with:  " + " ".join(
            f"{key}={_value(value)}" for key, value in changes.items()))
    lines.append("peak = live tensor bytes (weights..temporaries at the peak); +overhead adds "
                 "the CUDA context and allocator slack; host = offloaded bytes; step = "
                 "predicted seconds per optimizer step and tok/s the tokens it trains on per "
                 f"second ({_profile(result)}); peak at = the moment of the step that sets "
                 "the peak")
    return "\n".join(lines)


def _profile(result: Plan) -> str:
    profile = result.profile
    if profile.source == "calibrated":
        return f"this machine's {profile.name}, calibrated (memfit env --calibrate)"
    return f"{profile.name}'s builtin profile: {profile.note}"


def format_longest(result: LongestFit, config: Config) -> str:
    model = config.model.preset or config.model.path
    each = f" on each of {result.devices} devices" if result.devices > 1 else ""
    head = (f"memfit plan --max-length: {model}, micro-batch {config.train.micro_batch_size}, "
            f"budget {format_bytes(result.budget_bytes)}{each}, for "
            f"{device_label(result.device)}, context {result.context} tokens")
    if result.max_length is None:
        return (f"{head}\nno strategy fits {format_bytes(result.budget_bytes)} at "
                f"{MIN_LENGTH} tokens")
    needs = result.estimate
    parts = ", ".join(f"{key} {format_bytes(value)}" for key, value in needs.bytes.items()
                      if value)
    limit = " (the context length)" if result.max_length == result.context else ""
    lines = [head,
             f"longest data.max_length that fits: {result.max_length} tokens{limit} with "
             f"{result.strategy} (needs {format_bytes(needs.device_bytes)}: {parts}, overhead "
             f"{format_bytes(needs.device_overhead_bytes)}; host "
             f"{format_bytes(needs.host_bytes)}; peak at the {needs.peak_moment.name}); "
             f"{result.plans} configurations planned",
             "apply with:  " + " ".join(f"{key}={_value(value)}" for key, value
                                        in differing(config, result.overrides).items())]
    if result.beyond:
        lines.append(f"set {result.beyond} to train past the {result.context:,}-token window")
    return "\n".join(lines)


def _by_reason(skipped: dict[str, str]) -> dict[str, list[str]]:
    """Strategies skipped for the same reason on one line (FSDP2 refuses whole methods)."""
    grouped: dict[str, list[str]] = {}
    for name, why in skipped.items():
        grouped.setdefault(why, []).append(name)
    return grouped


def _value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
