"""Fine-tuning quality of each optimizer: final eval loss relative to AdamW.

    python benchmarks/quality.py [--steps 80] [--quick] [--only TEXT ...] [--threads 1]

The demo's pretrained base (src/memfit/demo/assets/base: a 0.9M-parameter Llama
pretrained on Aesop's Fables by scripts/pretrain_demo_base.py) is fine-tuned on the demo's
instruction set (questions about the fables, a format it never saw) through the real
``memfit.train`` API. Every run: the same seed, data order and held-out 10% eval split,
micro-batch 8, ``--steps`` optimizer steps (80 = 640 examples, under one epoch), warmup
10% then cosine decay, global-norm clipping at 1.0 (layer-wise: per tensor).

Full fine-tuning with adamw, adamw8bit (bitsandbytes), adafactor (torch), GaLore (rank 32
of the 128-wide model, update_gap 20, scale 3 — see GALORE_SCALE; inner adamw) with the online,
randomized_svd and random projectors, layer-wise GaLore randomized_svd (micro-batch 4 x 2
accumulation steps: the same 8 examples per step, accumulated as r x n projected
gradients), and LoRA (r 8, alpha 16, all linear layers, adamw).

Learning rate: each method tries three, a factor 3 apart around a centre suited to its
update rule. The one kept is the one with the lowest mean training loss over the last
quarter of its steps; those batches are seen for the first time when their loss is taken
(the run is under one epoch), so the choice never looks at the eval split. The reported
number is the kept run's eval loss after the last step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from _common import print_table

ADAMW_NAME = "AdamW"
SEED = 0


@dataclass(frozen=True)
class Method:
    name: str
    settings: dict[str, Any]  # nested like the YAML file, merged over base_config
    lrs: tuple[float, ...]  # ascending; the middle one is the centre
    target: float | None = None  # eval loss at most (1 + target) x AdamW's


def _galore(projector: str, **train: Any) -> dict[str, Any]:
    return {"optimizer": {"name": "galore", "galore": {
        "projector": projector, "rank": 32, "update_gap": 20, "scale": GALORE_SCALE}},
        **({"train": train} if train else {})}


# GaLore's scale multiplies only the projected matrices' update; the embedding and head get
# the plain lr. 0.25 is the paper's pre-training value; for this fine-tuning a hand sweep
# (80 steps, randomized_svd, eval loss; AdamW 0.917) gave scale/lr 0.25/3e-3 1.055,
# 1/1e-3 0.961, 2/1e-3 1.032, 3/3e-4 0.953, 4/3e-4 0.960, 4/2e-4 0.968, 8/1.5e-4 0.970.
GALORE_SCALE = 3.0
# Centres: Adam-type 3e-4 (a first sweep centred on 1e-3 kept its lowest lr); GaLore the
# same (its matrices move GALORE_SCALE x faster); LoRA the demo's 3e-3 (its
# zero-initialised B needs larger steps); torch Adafactor's lr caps a step that is
# relative to each weight's RMS.
ADAM_LRS = (1e-4, 3e-4, 1e-3)
GALORE_LRS = ADAM_LRS
LORA_LRS = (1e-3, 3e-3, 1e-2)
METHODS = (
    Method(ADAMW_NAME, {"optimizer": {"name": "adamw"}}, ADAM_LRS),
    Method("AdamW 8-bit (bnb)", {"optimizer": {"name": "adamw8bit"}}, ADAM_LRS, 0.01),
    Method("Adafactor (torch)", {"optimizer": {"name": "adafactor"}}, (3e-3, 1e-2, 3e-2)),
    Method("GaLore online", _galore("online"), GALORE_LRS, 0.03),
    Method("GaLore randomized_svd", _galore("randomized_svd"), GALORE_LRS, 0.03),
    Method("GaLore random (APOLLO)", _galore("random"), GALORE_LRS),
    Method("GaLore randomized_svd, layer-wise, 4x2",
           {**_galore("randomized_svd", micro_batch_size=4, gradient_accumulation_steps=2),
            "optimizer": {**_galore("randomized_svd")["optimizer"], "layerwise": True}},
           GALORE_LRS),
    Method("LoRA r8 (AdamW)", {"adapter": {"kind": "lora", "rank": 8, "alpha": 16,
                                           "targets": ["all-linear"]},
                               "optimizer": {"name": "adamw"}}, LORA_LRS),
)


@dataclass
class Outcome:
    lr: float
    train_tail: float  # mean training loss over the last quarter of the steps
    eval_before: float
    eval_after: float
    trainable: int
    seconds: float


@dataclass
class Result:
    method: Method
    tried: list[Outcome] = field(default_factory=list)

    @property
    def kept(self) -> Outcome:
        return min(self.tried, key=lambda outcome: outcome.train_tail)


def base_config(steps: int, output_dir: Path) -> dict[str, Any]:
    from memfit.demo import demo_assets_dir

    return {
        "model": {"preset": "demo-base"},
        "data": {"path": str(demo_assets_dir() / "instructions.jsonl"),
                 "format": "instruction", "max_length": 128, "eval_fraction": 0.1},
        "train": {"micro_batch_size": 8, "gradient_accumulation_steps": 1,
                  "max_steps": steps, "warmup_steps": max(1, steps // 10),
                  "lr_schedule": "cosine", "max_grad_norm": 1.0, "eval_every": 0,
                  "save_every": 0, "keep_checkpoints": 1, "seed": SEED,
                  "output_dir": str(output_dir)},
        # The CPU tensor tracker slows a model this small; memory is not measured here.
        "log": {"tensorboard": False, "progress": False, "memory_every": 10**6},
    }


def run(method: Method, lr: float, steps: int, folder: Path) -> Outcome:
    import memfit
    from memfit.config.load import merge

    config = merge(merge(base_config(steps, folder), method.settings),
                   {"optimizer": {"lr": lr}})
    started = time.perf_counter()
    result = memfit.train(config)
    seconds = time.perf_counter() - started
    losses = [result.losses[step] for step in sorted(result.losses)]
    tail = losses[-max(1, steps // 4):]
    return Outcome(lr=lr, train_tail=statistics.mean(tail), eval_before=result.eval_losses[0],
                   eval_after=result.eval_losses[max(result.eval_losses)],
                   trainable=result.summary["trainable_parameters"], seconds=seconds)


def print_results(results: list[Result]) -> None:
    adamw = next((r.kept.eval_after for r in results if r.method.name == ADAMW_NAME), None)
    columns = [("method", 40), ("lr tried: train loss (last 1/4)", 46), ("lr kept", 9),
               ("eval before", 12), ("eval after", 11), ("x AdamW", 8), ("trainable", 10)]
    rows = []
    for result in results:
        kept = result.kept
        tried = "  ".join(f"{o.lr:.0e}:{o.train_tail:.3f}" for o in result.tried)
        edge = "*" if len(result.tried) > 1 and kept.lr in (result.tried[0].lr,
                                                            result.tried[-1].lr) else ""
        ratio = f"{kept.eval_after / adamw:.3f}" if adamw else "-"
        rows.append([result.method.name, tried, f"{kept.lr:.0e}{edge}",
                     f"{kept.eval_before:.4f}", f"{kept.eval_after:.4f}", ratio,
                     f"{kept.trainable:,}"])
    print_table(columns, rows)
    print("* the kept lr is at the edge of the tried range")
    if adamw is None:
        return
    print()
    for result in results:
        if result.method.target is None:
            continue
        ratio = result.kept.eval_after / adamw
        met = ratio <= 1 + result.method.target
        print(f"{result.method.name} / {ADAMW_NAME}, final eval loss: {ratio:.4f} "
              f"({'met' if met else 'MISSED'}: target within {result.method.target:.0%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=80, help="optimizer steps per run")
    parser.add_argument("--quick", action="store_true",
                        help="only each method's centre lr, 30 steps: a fast look")
    parser.add_argument("--only", nargs="+", default=[], metavar="TEXT",
                        help=f"only the methods whose name contains one of these (and always "
                             f"{ADAMW_NAME}, the baseline)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 keeps a shared machine steady (default "
                             "%(default)s)")
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    steps = 30 if arguments.quick else arguments.steps
    methods = [m for m in METHODS if m.name == ADAMW_NAME or not arguments.only
               or any(text in m.name for text in arguments.only)]
    print(f"demo base fine-tuned on the demo instruction set: {steps} steps, seed {SEED}, "
          f"{arguments.threads} thread(s)\n", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as temporary:
        for method in methods:
            result = Result(method)
            lrs = (method.lrs[len(method.lrs) // 2],) if arguments.quick else method.lrs
            for lr in lrs:
                outcome = run(method, lr, steps, Path(temporary) / f"run-{len(results)}-{lr}")
                result.tried.append(outcome)
                print(f"  {method.name}, lr {lr:.0e}: train loss (last 1/4) "
                      f"{outcome.train_tail:.4f}, eval {outcome.eval_after:.4f}, "
                      f"{outcome.seconds:.0f}s", flush=True)
            results.append(result)
    print()
    print_results(results)


if __name__ == "__main__":
    main()
