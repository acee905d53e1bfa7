"""What the default memory meter costs a CPU run: its time against the same run measuring
no step, in the same invocation.

    python benchmarks/meter_cost.py [--repeats 3] [--threads 1] [--only demo|tiny-llama]
                                    [--steps N]

Cases, each through the real ``memfit.train`` API (build, evaluations, export included):

- ``demo``: the built-in demo as shipped (``memfit train`` with no arguments: the demo base
  and its instruction set, LoRA on all linear layers, 150 steps, evaluations at steps 0,
  50, 100 and 150), checkpoints and TensorBoard off;
- ``tiny-llama``: the ``tiny-llama`` preset on the same instructions, LoRA r 8 on all
  linear layers, micro-batch 8, 150 steps, one evaluation at the start and one at the end.

Each case runs in three settings: ``default`` (``log.memory_every`` as the case's config
leaves it: ``auto``), ``off`` (``log.memory_every`` beyond the run: no step measured, the
baseline) and ``every`` (``log.memory_every=1``: the tracker on every step, for scale).
Every run is a process of its own, started in turn (default, off, every, default, off,
...) so that other load on the machine spreads over all three; the table gives medians.
The ratio is the run's time (wall, and CPU time of the process, which load on a shared
machine disturbs less) with the default meter over the run without it: the issue's
target is <= 1.05. ``peak`` is the summary's memory_peak_bytes (exact live tensor bytes)
and its step; sampling changes which steps are measured, never the bytes of one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from memfit.bench.process import add_case_arguments, run_script_case, write_result
from memfit.bench.table import text_table

NEVER = 10**9  # log.memory_every beyond any run here: no step measured
SETTINGS = {"default": None, "off": NEVER, "every": 1}
CASES = {
    "demo": [],
    "tiny-llama": ["model.preset=tiny-llama", "train.warmup_steps=0", "train.eval_every=0"],
}
QUIET = ["train.save_every=0", "log.tensorboard=false", "log.progress=false"]


def _child(case: str, setting: str, steps: int | None, threads: int, result: Path) -> None:
    import torch

    import memfit
    from memfit.demo.defaults import demo_config_path
    from memfit.techniques.config_checks import load_config

    torch.set_num_threads(threads)
    overrides = [*CASES[case], *QUIET]
    if steps is not None:
        overrides.append(f"train.max_steps={steps}")
    if SETTINGS[setting] is not None:
        overrides.append(f"log.memory_every={SETTINGS[setting]}")
    with tempfile.TemporaryDirectory() as folder:
        config = load_config(demo_config_path(), [*overrides, f"train.output_dir={folder}/run"])
        wall, cpu = time.perf_counter(), time.process_time()
        summary = memfit.train(config).summary
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    write_result(result, {"wall": wall, "cpu": cpu, "peak": summary["memory_peak_bytes"],
                          "peak_step": summary.get("memory_peak_step"),
                          "measured": summary.get("memory_measured_steps", 0),
                          "steps": summary["steps"]})


def _runs(case: str, repeats: int, steps: int | None, threads: int) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {setting: [] for setting in SETTINGS}
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(repeats):
            for setting in SETTINGS:
                arguments = ["--case", case, "--setting", setting, "--threads", str(threads)]
                if steps is not None:
                    arguments += ["--steps", str(steps)]
                found[setting].append(run_script_case(
                    __file__, arguments, Path(folder) / f"{setting}-{repeat}.json"))
                print(f"  {case} {setting} #{repeat + 1}: "
                      f"{json.dumps(found[setting][-1])}", file=sys.stderr)
    return found


def _row(case: str, runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    def median(setting: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[setting])

    default = runs["default"][0]
    peak = (f"{default['peak']:,} B at step {default['peak_step']}"
            if default["peak"] is not None else "not measured")
    return [case, f"{default['measured']} of {default['steps']}",
            f"{median('default', 'wall'):.1f} / {median('off', 'wall'):.1f} / "
            f"{median('every', 'wall'):.1f}",
            f"{median('default', 'wall') / median('off', 'wall'):.3f}",
            f"{median('default', 'cpu') / median('off', 'cpu'):.3f}",
            f"{median('every', 'cpu') / median('off', 'cpu'):.3f}", peak]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    parser.add_argument("--steps", type=int, help="train.max_steps (default: the case's)")
    parser.add_argument("--setting", choices=sorted(SETTINGS), help=argparse.SUPPRESS)
    add_case_arguments(parser)
    args = parser.parse_args()
    if args.child:
        _child(args.case, args.setting, args.steps, args.threads, args.result)
        return
    rows = [_row(case, _runs(case, args.repeats, args.steps, args.threads))
            for case in args.only or CASES]
    print(text_table([("case", 11), ("measured steps", 16),
                      ("wall s: default / off / every", 32), ("default/off wall", 18),
                      ("default/off cpu", 17), ("every/off cpu", 15),
                      ("peak (default)", 32)], rows))


if __name__ == "__main__":
    main()
