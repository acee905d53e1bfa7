"""How accurate is `memfit plan`? Run: python benchmarks/plan_accuracy.py [--skip-measured]
[--architectures NAME,...]

1. Plan vs measured: every (architecture, strategy) case of tests/unit/plan/accuracy_cases.py
   is trained for real on CPU for 3 steps while the tensor tracker counts live storages;
   the table shows planned and measured peak tensor bytes and the error, then the median
   and worst |error| (targets: median <= 5%, worst <= 15%); an offloading case adds a
   "host" line: the plan's host bytes against the tracker's host pool. Its output is
   recorded in docs/planner.md ("Accuracy"); tests/unit/plan/test_docs_figures.py checks
   that the summary there and the README's quote of it are this table's (``summary``).
2. Published figures, planned for the setting each paper describes, with the assumptions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "unit" / "plan"))

from accuracy_cases import (  # noqa: E402
    WHOLE_RUN_MODELS,
    cases,
    measure_peak,
    whole_run_cases,
    write_data,
)
from whole_run import measure_whole_run  # noqa: E402

from memfit.plan import estimate  # noqa: E402
from memfit.plan.planner import load_plan_config  # noqa: E402

GB, GIB = 10**9, 2**30

# (name, published value, unit, overrides, assumptions)
PAPERS = [
    ("GaLore §5.5: LLaMA-7B, 8-bit GaLore + per-layer updates", 22.0, GB,
     ["model.preset=llama-2-7b", "optimizer.name=galore", "optimizer.galore.inner=adamw8bit",
      "optimizer.galore.rank=1024", "optimizer.layerwise=true", "precision=bf16-pure",
      "train.micro_batch_size=1", "data.max_length=256"],
     "LLaMA-7B = llama-2-7b shapes; bf16 weights; rank 1024; batch 1 x 256 tokens (the "
     "paper: <= 500 tokens, no checkpointing); CUDA overhead included"),
    ("LOMO Table 1: LLaMA-7B AdamW, checkpointing, s=512, b=8", 102.20, GIB,
     ["model.preset=llama-2-7b", "optimizer.name=adamw", "precision=bf16",
      "memory.gradient_checkpointing=true", "train.micro_batch_size=8",
      "data.max_length=512"],
     "LOMO counts fp16 weights + fp16 grads + fp32 master/m/v (16 B/param) analytically; "
     "memfit's mixed precision keeps fp32 weights and grads (also 16 B/param), and its "
     "AdamW step adds sqrt(exp_avg_sq) of one 64 MiB batch of parameters (BoundedAdamW; "
     "torch's foreach step: a whole parameter group, ~25 GiB more); tensor bytes (the "
     "paper's 'GB' are GiB: 6.74e9 x 2 B = 12.55)"),
    ("torchtune README: Llama-3.1-8B QLoRA, batch 2, packed 2048", 7.4, GIB,
     ["model.path=<config.json of llama-3.1-8b>", "model.dtype=bfloat16", "adapter.kind=qlora",
      "adapter.rank=8",
      "adapter.alpha=16", "precision=bf16", "memory.gradient_checkpointing=true",
      "memory.chunked_loss=true", "train.micro_batch_size=2", "data.max_length=2048"],
     "torchtune's recipe: bf16 model, rank 8 on all linear layers but the output, NF4 "
     "base with bf16 embedding and output layer, activation checkpointing, chunked "
     "cross-entropy, fp32 AdamW on the adapters; peak allocated tensor bytes; planned as "
     "the checkpoint's folder (its config.json), which is quantized one layer at a time "
     "onto the GPU while it loads"),
]


def measured_table(only: set[str] | None = None) -> None:
    folder = Path(tempfile.mkdtemp(prefix="plan-accuracy-"))
    data = write_data(folder)
    errors = []
    print(f"{'architecture':<18}{'strategy':<22}{'planned':>12}{'measured':>12}{'error':>9}")
    for arch, name, config, example in cases(data, folder):
        if only is not None and arch not in only:
            continue
        plan = estimate(config, device="cpu", example_batch=example)
        planned = plan.peak_tensor_bytes
        peak, host = measure_peak(config)
        measured = peak.peak_bytes
        error = planned / measured - 1
        errors.append(abs(error))
        print(f"{arch:<18}{name:<22}{planned:>12,}{measured:>12,}{error:>+8.1%}")
        if host:
            print(f"{'':<18}{'  host':<22}{plan.host_bytes:>12,}{host:>12,}"
                  f"{plan.host_bytes / host - 1:>+8.1%}")
    print(f"\n{summary(errors)}\n")


def summary(errors: list[float]) -> str:
    """The table's last line, from each case's |planned / measured - 1|."""
    return (f"{len(errors)} cases: median |error| {statistics.median(errors):.1%}, "
            f"worst {max(errors):.1%} (targets: 5%, 15%)")


def whole_run_table(only: set[str] | None = None) -> None:
    models = tuple(m for m in WHOLE_RUN_MODELS if only is None or m in only)
    folder = Path(tempfile.mkdtemp(prefix="plan-whole-run-"))
    data = write_data(folder)
    errors = []
    print(f"{'model':<12}{'strategy':<23}{'planned':>14}{'measured':>14}{'error':>8}  "
          "measured peak in / plan's peak moment")
    for model, name, config in whole_run_cases(data, folder, models):
        plan = estimate(config, device="cpu")
        run = measure_whole_run(config, folder / f"run-{model}-{name}")
        error = plan.peak_tensor_bytes / run.peak_bytes - 1
        errors.append(error)
        print(f"{model:<12}{name:<23}{plan.peak_tensor_bytes:>14,}{run.peak_bytes:>14,}"
              f"{error:>+7.1%}  {run.phase} / {plan.peak_moment.name}")
    print(f"\n{whole_run_summary(errors)}\n")


def whole_run_summary(errors: list[float]) -> str:
    """The whole-run table's last line, from each case's planned / measured - 1."""
    return (f"{len(errors)} whole runs: median |error| "
            f"{statistics.median(abs(e) for e in errors):.1%}, lowest {min(errors):+.1%}, "
            f"highest {max(errors):+.1%} (targets: median <= 3%, none below 0)")


def paper_table() -> None:
    folder = Path(tempfile.mkdtemp(prefix="plan-papers-"))
    for name, published, unit, overrides, assumptions in PAPERS:
        result = estimate(load_plan_config(None, [_config_folder(o, folder) for o in overrides]))
        unit_name = "GB" if unit == GB else "GiB"
        with_overhead = result.device_bytes / unit
        tensors = result.peak_tensor_bytes / unit
        planned = with_overhead if unit == GB else tensors
        print(f"{name}\n  published {published:.1f} {unit_name}; planned {planned:.1f} "
              f"{unit_name} ({planned / published - 1:+.1%}); tensors {tensors:.1f}, with "
              f"CUDA overhead {with_overhead:.1f}")
        print("  " + ", ".join(f"{k} {v / unit:.2f}" for k, v in result.bytes.items()))
        print(f"  assumptions: {assumptions}\n")


def _config_folder(override: str, folder: Path) -> str:
    """``model.path=<config.json of PRESET>`` -> model.path of a folder holding only that
    preset's config.json (a checkpoint's folder as the planner reads it: no weights)."""
    key, _, value = override.partition("=")
    if not (value.startswith("<config.json of ") and value.endswith(">")):
        return override
    from memfit.models.presets import PRESETS

    preset = value.removeprefix("<config.json of ").removesuffix(">")
    PRESETS[preset]().save_pretrained(folder / preset)
    return f"{key}={folder / preset}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-measured", action="store_true",
                        help="only the published figures (no training)")
    parser.add_argument("--architectures", metavar="NAME,...",
                        help="measure only these architectures (e.g. gpt-neox,qwen2,phi3; "
                             "opt and llama-69m are whole runs only)")
    parser.add_argument("--whole-runs-only", action="store_true",
                        help="only the whole-run table (and the published figures)")
    args = parser.parse_args()
    only = set(args.architectures.split(",")) if args.architectures else None
    if not args.skip_measured:
        if not args.whole_runs_only:
            measured_table(only)
        whole_run_table(only)
    paper_table()


if __name__ == "__main__":
    main()
