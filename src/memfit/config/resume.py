"""What ``--resume RUN key=value`` may change: only keys that do not change what is being
trained (how long, how often to save / evaluate / log, how a step's batch is split over
processes and micro-batches). Changing the model, the data, the
optimizer, the learning rate or the seed would make the resumed run a different run
glued onto the first one's state, so those are refused."""

from __future__ import annotations

from memfit._utils.errors import ConfigError
from memfit.config.ignored import flatten
from memfit.config.load import to_mapping
from memfit.config.schema import Config

# Exact keys, or a whole section written as "log.*".
RESUMABLE_KEYS = (
    "train.max_steps",
    "train.epochs",
    "train.save_every",
    "train.eval_every",
    "train.keep_checkpoints",
    "train.on_nonfinite",
    "train.max_consecutive_skips",
    "distributed.nproc",
    "distributed.strategy",
    "data.sample_prompts",
    "data.sample_max_new_tokens",
    "log.*",
)


def _resumable(key: str) -> bool:
    return any(key == allowed or (allowed.endswith(".*") and key.startswith(allowed[:-1]))
               for allowed in RESUMABLE_KEYS)


# How an optimizer step's examples are split: over processes, micro-batches and passes.
# Any split of the same effective batch trains the same steps on the same examples (the
# batch stream counts global examples and the loss is normalised over the whole step).
# distributed.sequence_parallel: the ranks of a sequence group share their examples.
_BATCH_SPLIT_KEYS = ("train.micro_batch_size", "train.gradient_accumulation_steps",
                     "distributed.nproc", "distributed.sequence_parallel")


def effective_batch(config: Config) -> int:
    groups = max(config.distributed.nproc // config.distributed.sequence_parallel, 1)
    return config.train.micro_batch_size * config.train.gradient_accumulation_steps * groups


def check_resume_changes(saved: Config, resumed: Config, run_dir: str) -> list[str]:
    """Raise when ``resumed`` changes a key that would make it another run; returns the
    (resumable) dotted keys it changes."""
    before, after = flatten(to_mapping(saved)), flatten(to_mapping(resumed))
    changed = sorted(key for key in before.keys() | after.keys()
                     if before.get(key) != after.get(key))
    same_batch = effective_batch(saved) == effective_batch(resumed)
    refused = [key for key in changed
               if not (_resumable(key) or (same_batch and key in _BATCH_SPLIT_KEYS))]
    if refused:
        shown = ", ".join(f"{key} ({before.get(key)!r} -> {after.get(key)!r})" for key in refused)
        raise ConfigError(
            f"--resume {run_dir} cannot change {shown} (by an override or an edit of its "
            f"config.yaml): it would no longer be the same run; a resumed run may change only "
            f"{', '.join(RESUMABLE_KEYS)}, and {', '.join(_BATCH_SPLIT_KEYS)} when their "
            f"product (the effective batch, {effective_batch(saved)}) stays the same; start a "
            "new run for anything else")
    return changed
