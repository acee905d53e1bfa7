"""The strategies the planner compares, their order of preference, and the OOM ladder.

A strategy is a set of config overrides (dotted keys, the values users write). Order of
preference (docs/planner.md explains it): quality first, then speed —

  methods  full-adamw, full-adamw8bit, full-adafactor, full-galore,
           full-galore8bit-layerwise (bf16-pure), full-galore-layerwise (bf16-pure),
           lora, qlora
           (full-parameter training before adapters: GLUE avg full 86.28 > GaLore 85.89 >
           LoRA 85.61, GaLore paper; 8-bit Adam matches 32-bit; a 4-bit base is lossy)
  levels   plain, +ckpt (checkpointing, and for LMs chunked loss and the tiled MLP:
           ~30% slower), +offload (also activations and, but for layer-wise, optimizer
           state in host memory: slowest; under fsdp QLoRA's too, where FSDP2's
           CPUOffloadPolicy holds each process's shards of the 4-bit base, the adapters and
           their state. Not LoRA's: its base would be host bytes in bf16, four times as
           many, pinned and copied to the device twice a step, and the plan has no host
           budget to weigh them against)

so every level of a method is tried before the next method.
"""

from __future__ import annotations

from memfit.config.overrides import Overrides, value_of
from memfit.config.schema import AdapterKind, Config, DistributedStrategy, Task
from memfit.techniques.optimizers import SPECS, OptimizerSetting, spec_for
from memfit.techniques.registry import TECHNIQUES
from memfit.techniques.specs.spec import PLAN_LEVELS

# The two families of methods: full-parameter training in bf16 autocast (each optimizer
# spec's plan_methods), and adapters on a bf16 frozen base (embeddings and norms
# included) with fp32 adapters (PEFT; the adapter spec's plan_methods).
_FULL = {"adapter.kind": "none", "optimizer.layerwise": False, "precision": "bf16"}
_ADAPTER = {"optimizer.name": "adamw", "optimizer.layerwise": False, "precision": "bf16",
            "model.dtype": "bfloat16"}
METHODS: list[tuple[str, Overrides]] = [
    *((name, {**_FULL, "optimizer.name": spec.name, **overrides})
      for spec in SPECS.values() for name, overrides in spec.plan_methods),
    *((name, {**_ADAPTER, **overrides})
      for spec in TECHNIQUES for name, overrides in spec.plan_methods),
]


# What every row starts from: the techniques' row_reset keys at their defaults, so a row
# differs from the user's config in what changes what is trained only where its method or
# level says so.
_RESET: Overrides = {key: value_of(Config(), key) for spec in TECHNIQUES for key in spec.row_reset}

# The levels' name suffixes, in order: plain, checkpointing, offload; and the planner's
# partial level between two of them that fits a budget (plan/search.py).
LEVELS = ("", *PLAN_LEVELS)
FIT = "+fit"


def levels(state_offload_ok: bool, chunked_loss_ok: bool, tiled_mlp_ok: bool = False,
           tiled_norms_ok: bool = False) -> list[tuple[str, Overrides]]:
    """plain, +ckpt, +offload, each switching on the techniques of the levels up to it
    (techniques/specs: a spec's ``level``), but for those that cannot apply: optimizer
    state goes to the host only where it can (full-parameter training that steps after
    backward: layer-wise steps run inside it), the loss is chunked for causal LMs, and the
    MLP is tiled where the model has MLP modules (a micro-batch of at most
    memory.mlp_chunk_tokens tokens runs untiled, so short sequences lose nothing, and a
    long one keeps one chunk's MLP activations instead of the sequence's), and so are the
    norms where it has RMSNorm / LayerNorm modules."""
    can_apply = {"memory.optimizer_offload": state_offload_ok,
                 "memory.chunked_loss": chunked_loss_ok, "memory.tiled_mlp": tiled_mlp_ok,
                 "memory.tiled_norms": tiled_norms_ok}
    found = [("", dict(_RESET))]
    for level in PLAN_LEVELS:
        switched = {spec.row_reset[0]: can_apply.get(spec.row_reset[0], True)
                    for spec in TECHNIQUES if spec.level == level}
        found.append((level, {**found[-1][1], **switched}))
    return found


def strategies(chunked_loss_ok: bool, tiled_mlp_ok: bool = False, tiled_norms_ok: bool = False,
               sharded: bool = False) -> list[tuple[str, Overrides]]:
    """Every (name, overrides) in order of preference; ``sharded``: as planned under fsdp,
    whose host offload (CPUOffloadPolicy) moves a QLoRA run's shards too."""
    ordered = []
    for method, overrides in METHODS:
        kind = overrides["adapter.kind"]
        state_offload_ok = (kind == "none" or (sharded and kind == "qlora")) and not overrides[
            "optimizer.layerwise"]
        for suffix, memory in levels(state_offload_ok, chunked_loss_ok, tiled_mlp_ok,
                                     tiled_norms_ok):
            ordered.append((method + suffix, {**overrides, **memory}))
    return ordered


def next_cheaper(config: Config) -> Overrides | None:
    """The next rung of the OOM ladder as overrides, or None at the bottom: the first of
    ``rungs``."""
    return next(iter(rungs(config)), None)


def rungs(config: Config) -> list[Overrides]:
    """Every rung of the OOM ladder that applies to ``config``, in the ladder's order:

    1. divide the micro-batch by its smallest factor and multiply accumulation by it (the
       effective batch and the loss normalisation stay the same), down to 1;
    2. activation checkpointing; 3. chunked loss (causal LMs); 4. the optimizer spec's cheaper
       setting (8-bit AdamW state, GaLore's 8-bit inner rule);
    5. activation offload; 6. optimizer-state offload (full-parameter training, and QLoRA
       under fsdp: FSDP2's CPUOffloadPolicy, as ``strategies(sharded=True)``).
    """
    train, memory, optimizer = config.train, config.memory, config.optimizer
    found: list[Overrides] = []
    if train.micro_batch_size > 1:
        factor = next(f for f in range(2, train.micro_batch_size + 1)
                      if train.micro_batch_size % f == 0)
        found.append({"train.micro_batch_size": train.micro_batch_size // factor,
                      "train.gradient_accumulation_steps":
                          train.gradient_accumulation_steps * factor})
    if not memory.gradient_checkpointing:
        found.append({"memory.gradient_checkpointing": True})
    if not memory.chunked_loss and config.model.task is Task.CAUSAL_LM and not config.model.factory:
        found.append({"memory.chunked_loss": True})
    cheaper_optimizer = spec_for(config.optimizer).cheaper(OptimizerSetting.of(config))
    if cheaper_optimizer is not None:
        found.append(cheaper_optimizer)
    if not memory.activation_offload:
        found.append({"memory.activation_offload": True})
    sharded_qlora = (config.adapter.kind is AdapterKind.QLORA
                     and config.distributed.strategy is DistributedStrategy.FSDP)
    if (not memory.optimizer_offload and not optimizer.layerwise  # layer-wise: in backward
            and (config.adapter.kind is AdapterKind.NONE or sharded_qlora)):
        found.append({"memory.optimizer_offload": True})
    return found
