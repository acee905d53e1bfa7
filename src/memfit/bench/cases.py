"""What ``memfit bench`` compares: memfit strategies and the tools people use today.

Every case is described by memfit config overrides on top of the bench's shared config
(same model, data, seed, batch, steps, constant learning rate, no clipping). For a memfit
case they are what ``memfit.train`` runs; for a peer they are the memfit configuration
doing the same job — the peer reads its settings (learning rate, precision, LoRA rank,
GaLore rank ...) from it, and the planner's estimate of it is the peer's "plan" column.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

from memfit._utils.errors import ConfigError

# Full-parameter training moves every weight, so it takes a smaller step than adapters.
FULL_LR, ADAPTER_LR = 1e-3, 3e-3

_FULL = {"adapter.kind": "none", "optimizer.lr": FULL_LR}
_ADAMW = {**_FULL, "optimizer.name": "adamw"}
_ADAMW8BIT = {**_FULL, "optimizer.name": "adamw8bit"}
_ADAFACTOR = {**_FULL, "optimizer.name": "adafactor"}
_GALORE = {**_FULL, "optimizer.name": "galore", "optimizer.galore.inner": "adamw"}
_GALORE_LAYERWISE = {**_GALORE, "optimizer.layerwise": True}
_LORA = {"adapter.kind": "lora", "optimizer.name": "adamw", "optimizer.lr": ADAPTER_LR}
_LORA_CKPT = {**_LORA, "memory.gradient_checkpointing": True}
# QLoRA computes in bf16 (its 4-bit base dequantizes to the compute dtype).
_QLORA = {**_LORA, "adapter.kind": "qlora", "precision": "bf16"}


@dataclass(frozen=True)
class Case:
    name: str
    overrides: dict[str, Any]
    peer: str | None = None  # the peer loop (bench.peers) to run; None: memfit.train
    mirrors: str | None = None  # the memfit case this peer does the same job as
    requires: tuple[str, ...] = field(default=())  # modules that must be importable

    def missing(self) -> list[str]:
        """Required modules that are not installed here."""
        return [name for name in self.requires if importlib.util.find_spec(name) is None]


BASELINE = "PyTorch AdamW"

CASES: tuple[Case, ...] = (
    Case(BASELINE, _ADAMW, peer="torch-adamw", mirrors="memfit full AdamW"),
    Case("memfit full AdamW", _ADAMW),
    Case("bitsandbytes AdamW8bit", _ADAMW8BIT, peer="bnb-adamw8bit",
         mirrors="memfit full AdamW8bit"),
    Case("memfit full AdamW8bit", _ADAMW8BIT),
    Case("torch Adafactor", _ADAFACTOR, peer="torch-adafactor", mirrors="memfit full Adafactor"),
    Case("memfit full Adafactor", _ADAFACTOR),
    Case("galore-torch GaLoreAdamW", _GALORE, peer="galore-torch", mirrors="memfit GaLore",
         requires=("galore_torch",)),
    Case("memfit GaLore", _GALORE),
    Case("galore-torch per-layer", _GALORE_LAYERWISE, peer="galore-torch-layerwise",
         mirrors="memfit GaLore layer-wise", requires=("galore_torch",)),
    Case("HF Trainer galore_adamw_layerwise", _GALORE_LAYERWISE, peer="hf-trainer-galore",
         mirrors="memfit GaLore layer-wise", requires=("galore_torch", "accelerate")),
    Case("memfit GaLore layer-wise", _GALORE_LAYERWISE),
    Case("PEFT LoRA", _LORA, peer="peft", mirrors="memfit LoRA"),
    Case("memfit LoRA", _LORA),
    Case("PEFT LoRA + checkpointing", _LORA_CKPT, peer="peft",
         mirrors="memfit LoRA + checkpointing"),
    Case("memfit LoRA + checkpointing", _LORA_CKPT),
    Case("PEFT + bitsandbytes QLoRA", _QLORA, peer="peft", mirrors="memfit QLoRA"),
    Case("memfit QLoRA", _QLORA),
)
BY_NAME = {case.name: case for case in CASES}

# Named selections for --cases. gpu-check: what benchmarks/gpu_check.sh measures.
GROUPS: dict[str, tuple[str, ...]] = {
    "all": tuple(BY_NAME),
    "memfit": tuple(case.name for case in CASES if case.peer is None),
    "peers": tuple(case.name for case in CASES if case.peer is not None),
    "gpu-check": ("PEFT LoRA", "memfit LoRA", "PEFT + bitsandbytes QLoRA", "memfit QLoRA",
                  "bitsandbytes AdamW8bit", "memfit full AdamW8bit",
                  "HF Trainer galore_adamw_layerwise", "memfit GaLore layer-wise"),
}


def select(selection: str | None) -> list[Case]:
    """``--cases``: a group name (all, memfit, peers, gpu-check) or comma-separated case
    names; None: all. Raises ConfigError naming the unknown entry and the choices."""
    if not selection:
        return list(CASES)
    if selection in GROUPS:
        return [BY_NAME[name] for name in GROUPS[selection]]
    chosen = []
    for name in (part.strip() for part in selection.split(",")):
        if name not in BY_NAME:
            choices = ", ".join([*GROUPS, *BY_NAME])
            raise ConfigError(f"--cases: {name!r} is not a case or group; choose from: {choices}")
        chosen.append(BY_NAME[name])
    return chosen
