"""Peak memory and step time of memfit's optimizers against the libraries they replace.

    python benchmarks/optimizers.py [--quick] [--all] [--only TEXT ...] [--threads 1]

The 69M Llama-architecture model of benchmarks/memory_techniques.py (hidden 768, 8
layers, 12 heads, intermediate 2064, vocab 8000, untied head; ``--quick``: hidden 256, 4
layers, vocab 2000), random weights, batch 1 x sequence 128 of fixed random tokens, loss
``model(**batch).loss``, no clipping, lr 1e-4 (Adafactor: 1e-2, torch's default cap on its
relative step). Every case runs in its own process:

1. ``METERED_STEPS`` steps inside memfit's memory meter (CPU: exact live tensor storages,
   split by category at the peak; the first step creates the optimizer state and the
   first projector, so the peak includes both);
2. then ``TIMED_STEPS`` timed steps (forward, backward, optimizer step) without the meter,
   whose per-op bookkeeping would distort time (the metered steps are the warm-up). GaLore
   refreshes its projector every ``UPDATE_GAP`` = ``TIMED_STEPS`` steps, so the timed steps
   hold exactly one refresh: their mean is the mean over a 10-step refresh period, and the
   refresh step's time with the median of the others gives the mean over a period of
   memfit's default update_gap (200, the GaLore paper's T):
   (refresh + 199 * ordinary) / 200.

memfit cases go through memfit's own model preparation and ``optimizer.*`` factory.
GaLore: rank hidden/6 (128), scale 0.25, attention and MLP matrices projected, embeddings
and head updated by the inner rule; memfit's GaLore takes R = P^T G from backward on steps
that keep P unless the case says ``project_in_backward=false``. Peers: torch.optim.AdamW
and torch.optim.Adafactor with torch's defaults, bitsandbytes AdamW8bit, and galore-torch
1.0 (``pip install -e .[bench]``) as its README and the GaLore paper's per-layer recipe use
it (one optimizer per parameter stepped from a post-accumulate-grad hook). A peer that
cannot run here is skipped with a note. Ratios are against torch AdamW measured in the same
run; it runs first and again last, and a warning says when its time moved (other load on
the machine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from memfit.bench.cases import Case
from memfit.bench.process import CaseFailed, add_case_arguments, run_script_case, write_result
from memfit.bench.random_llama import (
    LLAMA_69M,
    LlamaShape,
    llama_config,
    save_random_model,
    token_batch,
)
from memfit.bench.script_case import case_config, memfit_training, peer_training
from memfit.bench.table import text_table
from memfit.config.schema import GaloreConfig, GaloreProjector
from memfit.techniques.optimizers import SPECS
from memfit.techniques.optimizers.spec import bench_lines

MIB = 2**20
SEQUENCE, LR, ADAFACTOR_LR = 128, 1e-4, 1e-2
METERED_STEPS, TIMED_STEPS = 2, 10
UPDATE_GAP = TIMED_STEPS
DEFAULT_UPDATE_GAP = GaloreConfig.update_gap  # memfit's default, the GaLore paper's T
SCALE = 0.25
QUICK = LlamaShape(hidden=256, layers=4, heads=4, intermediate=688, vocab=2000)
CATEGORIES = ("weights", "grads", "optimizer", "activations", "temporaries")

PROJECTORS = tuple(projector.value for projector in GaloreProjector)
# Every registered optimizer's lines, from its spec (``bench``): label -> overrides.
LINES = [line for spec in SPECS.values() for line in bench_lines(spec)]
OPTIMIZERS = {line.label: dict(line.settings) for line in LINES}
# memfit's optimizers that write bf16 weights back with stochastic rounding.
BF16_PURE_OPTIMIZERS = tuple(name for name, spec in SPECS.items() if spec.rounds_stochastically)
FULL_GRADIENT_GALORE = "galore randomized_svd/adamw, project_in_backward=false"


def _in_table_order(combination: tuple[int, bool, str]) -> tuple:
    """fp32 first (every line once, then layer-wise), then bf16-pure line by line."""
    index, layerwise, precision = combination
    pure = precision == "bf16-pure"
    return (pure, not pure and layerwise, index, layerwise)


# The default run, (optimizer, layer-wise, precision): the modes each spec's lines name
# (every optimizer once, then layer-wise and bf16-pure where they change the picture).
# --all runs every combination (about twice as long).
DEFAULT_COMBINATIONS = [(LINES[index].label, layerwise, precision) for index, layerwise, precision
                        in sorted(((index, *mode) for index, line in enumerate(LINES)
                                   for mode in line.modes), key=_in_table_order)]


def _memfit_case(optimizer: str, layerwise: bool, precision: str) -> Case:
    name = optimizer + (", layer-wise" if layerwise else "") + \
        (", bf16-pure" if precision == "bf16-pure" else "")
    settings = {**OPTIMIZERS[optimizer], "precision": precision,
                "optimizer.layerwise": str(layerwise).lower()}
    return Case(name, settings)


def _all_combinations() -> list[tuple[str, bool, str]]:
    return [(optimizer, layerwise, precision) for optimizer, settings in OPTIMIZERS.items()
            for precision in (("fp32", "bf16-pure") if settings["optimizer.name"] in
                              BF16_PURE_OPTIMIZERS else ("fp32",))
            for layerwise in (False, True)]


PEER_ADAMW = "peer: torch AdamW"
PEER_GALORE_PER_LAYER = "peer: galore-torch AdamW, per-layer"
# The peers keep their library's defaults where those differ from memfit's (weight_decay
# 0, eps 1e-8): torch's AdamW, bitsandbytes' AdamW8bit and galore-torch's GaLoreAdamW8bit
# decay by 0.01; galore-torch's GaLoreAdamW (transformers' old AdamW) has eps 1e-6.
TORCH_DEFAULTS = {"optimizer.weight_decay": 0.01}
GALORE_TORCH_DEFAULTS = {"optimizer.eps": 1e-6}
PEER_CASES = [
    Case(PEER_ADAMW, TORCH_DEFAULTS, peer="torch-adamw"),
    Case("peer: bnb AdamW8bit", TORCH_DEFAULTS, peer="bnb-adamw8bit"),
    Case("peer: torch Adafactor", {"optimizer.name": "adafactor"}, peer="torch-adafactor"),
    Case("peer: galore-torch AdamW", GALORE_TORCH_DEFAULTS, peer="galore-torch"),
    Case(PEER_GALORE_PER_LAYER, GALORE_TORCH_DEFAULTS, peer="galore-torch-layerwise"),
    Case("peer: galore-torch AdamW8bit, per-layer", TORCH_DEFAULTS,
         peer="galore-torch-8bit-layerwise"),
]
BASELINE_AGAIN = f"{PEER_ADAMW} (again, last)"
DEFAULT_GALORE = "galore randomized_svd/adamw"  # memfit's default projector and inner


def galore_rank(shape: LlamaShape) -> int:
    return shape.hidden // 6


def overrides(case: Case, shape: LlamaShape) -> dict[str, Any]:
    """The case's config: its own settings, then what every case shares."""
    adafactor = case.overrides.get("optimizer.name") == "adafactor"
    return {**case.overrides, "optimizer.lr": ADAFACTOR_LR if adafactor else LR,
            "train.max_grad_norm": "null", "optimizer.galore.rank": galore_rank(shape),
            "optimizer.galore.update_gap": UPDATE_GAP, "optimizer.galore.scale": SCALE}


def measure(case: Case, folder: Path, shape: LlamaShape, device: torch.device) -> dict:
    from memfit.monitor.memory import make_memory_meter

    config = case_config(folder, overrides(case, shape))
    built = (memfit_training(config, device) if case.peer is None
             else peer_training(case.peer, folder, config, device))
    built.model.train()
    data = token_batch(shape.vocab, SEQUENCE, device)

    def train_step() -> float:
        loss = built.model(**data).loss
        loss.backward()
        if built.optimizer is not None:  # None: per-layer peers, stepped in backward
            built.optimizer.step()  # memfit layer-wise: only publishes grad_norm
            built.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    meter = make_memory_meter(device)
    meter.attach(built.model, built.optimizer)
    for _ in range(METERED_STEPS):
        with meter.step():
            train_step()
    seconds = {}
    for step in range(METERED_STEPS, METERED_STEPS + TIMED_STEPS):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        loss = train_step()  # .item() synchronizes
        seconds[step] = time.perf_counter() - started
    refresh = seconds.pop(UPDATE_GAP)  # GaLore cases refresh P on step UPDATE_GAP
    ordinary = statistics.median(seconds.values())
    peak = meter.peak
    return {"peak": peak.peak_bytes, **peak.by_category,
            "step_seconds": (refresh + sum(seconds.values())) / TIMED_STEPS,
            "period_seconds": (refresh + (DEFAULT_UPDATE_GAP - 1) * ordinary)
            / DEFAULT_UPDATE_GAP, "loss": loss}


def print_results(results: dict[str, dict]) -> None:
    base = results[PEER_ADAMW]
    columns = [("case", 56), *((c[:11], 12) for c in CATEGORIES), ("peak MiB", 10),
               ("x AdamW", 8), (f"step s/{UPDATE_GAP}", 10), ("x AdamW", 8),
               (f"step s/{DEFAULT_UPDATE_GAP}", 11), ("x AdamW", 8), ("loss@end", 9)]
    print(text_table(columns, [
        [name, *(f"{row[c] / MIB:.1f}" for c in CATEGORIES), f"{row['peak'] / MIB:.1f}",
         f"{row['peak'] / base['peak']:.3f}", f"{row['step_seconds']:.3f}",
         f"{row['step_seconds'] / base['step_seconds']:.2f}", f"{row['period_seconds']:.3f}",
         f"{row['period_seconds'] / base['period_seconds']:.2f}", f"{row['loss']:.3f}"]
        for name, row in results.items()]))
    print("step s/N: mean step time over a refresh period of N steps (see the docstring)")


def print_targets(results: dict[str, dict], skipped: dict[str, str]) -> None:
    def verdict(ratio: float, limit: float) -> str:
        return f"{ratio:.3f} ({'met' if ratio <= limit else 'MISSED'}: target <= {limit})"

    memfit = {name: row for name, row in results.items() if not name.startswith("peer:")}
    leanest = min(memfit, key=lambda name: memfit[name]["peak"])
    if PEER_GALORE_PER_LAYER in results:
        ratio = memfit[leanest]["peak"] / results[PEER_GALORE_PER_LAYER]["peak"]
        print(f"leanest memfit mode ({leanest}) / {PEER_GALORE_PER_LAYER}, peak: "
              + verdict(ratio, 0.4))
    else:
        print(f"leanest memfit mode ({leanest}): no {PEER_GALORE_PER_LAYER} to compare "
              f"({skipped.get(PEER_GALORE_PER_LAYER, 'not run')})")
    if PEER_ADAMW not in results:
        print(f"step time: {PEER_ADAMW} was not run")
        return
    adamw = results[PEER_ADAMW]
    galore_cases = [f"galore {projector}/adamw" for projector in PROJECTORS]
    # The leanest mode may itself be one of the GaLore cases: print each once.
    for name in galore_cases + ([leanest] if leanest not in galore_cases else []):
        if name in results:
            mark = " (memfit's default GaLore)" if name == DEFAULT_GALORE else ""
            print(f"mean step time over a refresh period of {DEFAULT_UPDATE_GAP} steps, "
                  f"{name}{mark} / {PEER_ADAMW}: "
                  + verdict(results[name]["period_seconds"] / adamw["period_seconds"], 1.15)
                  + f"; over {UPDATE_GAP} steps: "
                  f"{results[name]['step_seconds'] / adamw['step_seconds']:.3f}")
    print("projector refresh vs full SVD at the same rank (target >= 10x): measured by "
          "`python benchmarks/projector_refresh.py`")


def child(arguments: argparse.Namespace) -> None:
    torch.set_num_threads(arguments.threads)
    every = PEER_CASES + [_memfit_case(*combination) for combination in _all_combinations()]
    case = next(case for case in every if case.name == arguments.case)
    shape = QUICK if arguments.quick else LLAMA_69M
    write_result(arguments.result,
                 measure(case, Path(arguments.model), shape, torch.device(arguments.device)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a small model (hidden 256, 4 layers, vocab 2000) for a fast look")
    parser.add_argument("--all", action="store_true",
                        help="every optimizer x layer-wise x precision combination")
    parser.add_argument("--only", nargs="+", default=[], metavar="TEXT",
                        help="run only the cases whose name contains one of these "
                             f"(and always {PEER_ADAMW!r}, the baseline)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per case; 1 keeps times steady on a shared "
                             "machine (default %(default)s)")
    add_case_arguments(parser)
    arguments = parser.parse_args()
    if arguments.child:
        child(arguments)
        return
    shape = QUICK if arguments.quick else LLAMA_69M
    combinations = _all_combinations() if arguments.all else DEFAULT_COMBINATIONS
    cases = PEER_CASES + [_memfit_case(*combination) for combination in combinations]
    cases = [case for case in cases if case.name == PEER_ADAMW or not arguments.only
             or any(text in case.name for text in arguments.only)]
    results: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary) / "llama"
        parameters = save_random_model(folder, llama_config(shape))
        print(f"model: Llama {shape.hidden}x{shape.layers}, vocab {shape.vocab}, "
              f"{parameters / 1e6:.1f}M parameters; batch 1 x {SEQUENCE}; GaLore rank "
              f"{galore_rank(shape)}, update_gap {UPDATE_GAP}; {METERED_STEPS} metered + "
              f"{TIMED_STEPS} timed steps; {arguments.threads} thread(s); device "
              f"{arguments.device}; bytes are peak live tensor storages (MiB)\n")
        # The baseline runs first and again last: on a shared machine the load can change
        # during the run, and only then do the two differ.
        baseline = next(case for case in cases if case.name == PEER_ADAMW)
        for name, case in [(case.name, case) for case in cases] + [(BASELINE_AGAIN, baseline)]:
            started = time.perf_counter()
            try:
                results[name] = run_script_case(__file__, [
                    "--case", case.name, "--model", str(folder), "--threads",
                    str(arguments.threads), "--device", arguments.device,
                    *(["--quick"] if arguments.quick else [])], Path(temporary) / "result.json")
            except CaseFailed as failure:
                if case.peer is None:
                    raise SystemExit(f"case {case.name!r} failed:\n{failure}") from None
                skipped[name] = failure.last_line
            print(f"  {name}: {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)
    if PEER_ADAMW not in results:
        raise SystemExit(f"the baseline {PEER_ADAMW!r} failed: {skipped[PEER_ADAMW]}")
    print_results(results)
    first, last = results[PEER_ADAMW]["step_seconds"], results[BASELINE_AGAIN]["step_seconds"]
    if max(first, last) > 1.2 * min(first, last):
        print(f"WARNING: the baseline's step time changed from {first:.3f} s to {last:.3f} s "
              "during the run (other load on this machine): step-time ratios are unreliable")
    for name, reason in skipped.items():
        print(f"note: {name} skipped, it failed here: {reason}")
    print("note: galore-torch keeps P inside a Python object in its optimizer state; the "
          "meter cannot see into it, so its P bytes count as temporaries\n")
    print_targets(results, skipped)


if __name__ == "__main__":
    main()
