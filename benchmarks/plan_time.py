"""Does `memfit plan` know time? Run: python benchmarks/plan_time.py [--cases NAME,...]
[--steps N] [--skip-ddp]

Every case (architecture x method) is planned (``memfit.plan.estimate`` priced with this
machine's calibrated profile, ``memfit.plan.step_time``) and trained for real on CPU with
one thread, memory meter off (``training.build`` and the loop's own optimizer step); the
measured step time is the median of the steps after two warm-up steps. DDP cases run
``memfit train`` as 2 gloo processes and read the median ``step_seconds`` of their
metrics.jsonl. Printed: predicted, measured, error per case, then the targets of #35:

- median |error| <= 15%, worst <= 35%;
- within one architecture and method, each level's predicted ratio to the plain level
  within 15% of the measured ratio;
- every pair of cases whose measured times differ by more than 25% ordered correctly.

The table is recorded in docs/planner.md ("Step times"). A benchmark, not a test: timings
swing on a shared machine; run it on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from memfit.config.load import merge  # noqa: E402
from memfit.plan import estimate  # noqa: E402
from memfit.plan.planned_device import planned_device  # noqa: E402
from memfit.plan.step_time import step_time  # noqa: E402
from memfit.techniques.config_checks import from_mapping  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from plan_time_report import report  # noqa: E402

SEQUENCE, MICRO_BATCH, IMAGE_SIDE = 256, 4, 64

_LORA = {"adapter": {"kind": "lora", "rank": 8, "targets": ["all-linear"]}}
METHODS = {
    "adamw": {},
    "adamw+ckpt": {"memory": {"gradient_checkpointing": True}},
    "adamw+ckpt-half": {"memory": {"gradient_checkpointing": True, "checkpoint_blocks": 0.5}},
    "adamw8bit": {"optimizer": {"name": "adamw8bit"}},
    "adafactor": {"optimizer": {"name": "adafactor"}},
    "galore": {"optimizer": {"name": "galore", "galore": {"rank": 32, "update_gap": 50}}},
    "galore-layerwise": {"optimizer": {"name": "galore", "layerwise": True,
                                       "galore": {"rank": 32, "update_gap": 50}}},
    "lora": _LORA,
    "lora+ckpt": {**_LORA, "memory": {"gradient_checkpointing": True}},
    "lora+ckpt-half": {**_LORA, "memory": {"gradient_checkpointing": True,
                                           "checkpoint_blocks": 0.5}},
    "lora+offload": {**_LORA, "memory": {"activation_offload": True}},
    "lora+ckpt+offload": {**_LORA, "memory": {"gradient_checkpointing": True,
                                              "activation_offload": True}},
    "qlora": {"adapter": {**_LORA["adapter"], "kind": "qlora"}},
}
# Which methods each architecture runs (the level pairs: adamw / adamw+ckpt, lora / ...).
MATRIX = {
    "llama": ("adamw", "adamw+ckpt", "adamw+ckpt-half", "adamw8bit", "adafactor", "galore",
              "galore-layerwise", "lora", "lora+ckpt", "lora+ckpt-half", "lora+offload",
              "lora+ckpt+offload", "qlora"),
    "gpt2": ("adamw", "adamw+ckpt", "adamw8bit", "adafactor", "galore"),
    "gpt-neox": ("adamw", "adafactor", "lora", "lora+ckpt", "qlora"),
    "qwen2": ("adamw", "galore-layerwise", "lora", "lora+ckpt", "qlora"),
    "autoencoder": ("adamw", "adamw+ckpt", "adamw+ckpt-half", "adafactor", "adamw8bit"),
}
DDP_CASES = (("llama", "adamw"), ("llama", "lora"))


def build_folders(folder: Path) -> dict[str, dict]:
    """Architecture -> its base config mapping (random-weight fp32 Hugging Face folders with
    the byte-level tokenizer, and a conv autoencoder factory on 64 x 64 images)."""
    import transformers

    from memfit.models.tokenizers import BYTE_VOCAB_SIZE, byte_level_tokenizer

    corpus = folder / "corpus.txt"
    rng = np.random.default_rng(0)
    corpus.write_text("\n".join(" ".join(f"w{x}" for x in rng.integers(0, 500, 60))
                                for _ in range(400)))
    shape = {"vocab_size": BYTE_VOCAB_SIZE, "hidden_size": 256, "num_hidden_layers": 4,
             "num_attention_heads": 4, "max_position_embeddings": 2 * SEQUENCE}
    models = {
        "llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(
            intermediate_size=688, num_key_value_heads=2, **shape)),
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=BYTE_VOCAB_SIZE, n_embd=256, n_layer=4, n_head=4,
            n_positions=2 * SEQUENCE)),
        "gpt-neox": transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
            intermediate_size=1024, **shape)),
        "qwen2": transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            intermediate_size=688, num_key_value_heads=2, **shape)),
    }
    text = {"data": {"path": str(corpus), "format": "text", "max_length": SEQUENCE,
                     "eval_fraction": 0.0}}
    bases = {}
    for name, model in models.items():
        path = folder / name
        torch.manual_seed(0)
        model.save_pretrained(path)
        byte_level_tokenizer().save_pretrained(path)
        bases[name] = {"model": {"path": str(path)}, **text}
    images = folder / "images.npz"
    np.savez(images, images=rng.standard_normal((64, 3, IMAGE_SIDE, IMAGE_SIDE),
                                                dtype=np.float32))
    bases["autoencoder"] = {"model": {"factory": "plan_time_models:conv_autoencoder",
                                      "task": "custom"},
                            "data": {"path": str(images), "format": "tensors",
                                     "eval_fraction": 0.0}}
    return bases


def example_for(arch: str) -> dict | None:
    if arch == "autoencoder":
        return {"images": torch.zeros(MICRO_BATCH, 3, IMAGE_SIDE, IMAGE_SIDE)}
    return None


def config_for(base: dict, method: str, steps: int, out: Path, ddp: bool = False):
    common = {"train": {"micro_batch_size": MICRO_BATCH, "max_steps": steps,
                        "max_grad_norm": 1.0, "output_dir": str(out)},
              "precision": "fp32",
              "log": {"tensorboard": False, "progress": False, "memory_every": 10**6}}
    if ddp:
        common["distributed"] = {"strategy": "ddp", "nproc": 2}
    overrides = METHODS[method]
    if base["model"].get("factory") and "adapter" in overrides:
        overrides = merge(overrides, {"adapter": {"targets": ["conv"]}})
    return from_mapping(merge(merge(common, base), overrides))


def measure(config, steps: int) -> float:
    """Median seconds of the loop's optimizer step after two warm-up steps, in process."""
    from memfit.training.batches import BatchStream
    from memfit.training.build import build_run
    from memfit.training.step import optimizer_step, step_parts

    run = build_run(config)
    run.model.train()
    train = config.train
    stream = BatchStream(run.splits.train, train.micro_batch_size, train.seed, run.collate)
    parts = step_parts(run)
    times = []
    for _ in range(steps):
        batches = [stream.next_batch() for _ in range(train.gradient_accumulation_steps)]
        items = sum(run.objective.count(batch) for batch in batches)
        start = time.perf_counter()
        optimizer_step(parts, batches, items)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def measure_ddp(config, folder: Path) -> float:
    """Median step_seconds of 2 gloo processes running `memfit train` (rank 0's record)."""
    import yaml

    from memfit.config import to_mapping

    spec = folder / f"ddp-{time.monotonic_ns()}.yaml"
    spec.write_text(yaml.safe_dump(to_mapping(config)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(HERE), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "memfit", "train", str(spec)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = [json.loads(line) for line in
               (Path(config.train.output_dir) / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["step_seconds"] for r in records
                             if "step_seconds" in r and r["step"] > 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", help="comma-separated arch:method (default: all)")
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--skip-ddp", action="store_true")
    args = parser.parse_args()
    chosen = set(args.cases.split(",")) if args.cases else None
    folder = Path(tempfile.mkdtemp(prefix="plan-time-"))
    bases = build_folders(folder)
    profile = planned_device("cpu").profile
    print(f"profile: {profile.note}; op {profile.op_seconds * 1e6:.1f} us")
    print(f"{'architecture':<13}{'method':<19}{'predicted':>11}{'measured':>11}{'error':>9}")
    rows = []
    cases = [(a, m, False) for a, methods in MATRIX.items() for m in methods]
    if not args.skip_ddp:
        cases += [(a, m, True) for a, m in DDP_CASES]
    for index, (arch, method, ddp) in enumerate(cases):
        label = f"{method}+ddp2" if ddp else method
        if chosen is not None and f"{arch}:{label}" not in chosen:
            continue
        config = config_for(bases[arch], method, args.steps, folder / f"run-{index}", ddp)
        predicted = step_time(estimate(config, "cpu", example_for(arch)).work, profile).seconds
        measured = measure_ddp(config, folder) if ddp else measure(config, args.steps)
        rows.append((arch, label, predicted, measured))
        print(f"{arch:<13}{label:<19}{predicted * 1e3:>9.1f}ms{measured * 1e3:>9.1f}ms"
              f"{predicted / measured - 1:>+8.1%}", flush=True)
    print()
    print("\n".join(report(rows)))


if __name__ == "__main__":
    main()
