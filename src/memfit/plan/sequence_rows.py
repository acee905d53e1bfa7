"""Sequence parallelism in a plan over several devices (distributed.sequence_parallel):
the widest split of each sequence that the devices and the model's attention heads allow,
and the rows that train with it.

They are planned where nothing else fits (``plan``) and searched by ``--max-length`` over
several devices: splitting a sequence divides its activations by the split, for all-to-alls
inside every attention layer (counted by the trace: distributed/sequence_parallel.py's
``PlannedGroup``).
"""

from __future__ import annotations

from memfit.config.overrides import Overrides
from memfit.config.schema import DistributedStrategy, ModelConfig, Task
from memfit.distributed.sequence_parallel import SUPPORTED_MODEL_TYPES, head_splits
from memfit.plan import meta


def widest_split(model: ModelConfig, devices: int) -> int:
    """The most processes that can share a sequence: the largest N dividing ``devices``
    and the model's attention and key/value heads; 1 where the model cannot be split (not
    a supported Hugging Face causal LM)."""
    found = None if model.factory else meta.hf_config(model)
    if (devices < 2 or found is None or model.task is not Task.CAUSAL_LM
            or getattr(found, "model_type", None) not in SUPPORTED_MODEL_TYPES):
        return 1
    return max(n for n in head_splits(found) if devices % n == 0)


def split_rows(rows: list[tuple[str, Overrides]], split: int) -> list[tuple[str, Overrides]]:
    """Each fsdp row (``fsdp:NAME``) as ``fsdp-spN:NAME``, sharing each sequence over
    ``split`` processes. Under FSDP2, as ALST (ZeRO-3 and Ulysses) does: the sequence is
    split where activations no longer fit, and the weights are sharded as well."""
    prefix = f"{DistributedStrategy.FSDP.value}:"
    return [(f"{DistributedStrategy.FSDP.value}-sp{split}:{name.removeprefix(prefix)}",
             {**overrides, "distributed.sequence_parallel": split})
            for name, overrides in rows if name.startswith(prefix)]
