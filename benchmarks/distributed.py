"""Data parallel (distributed.strategy=ddp) and FSDP2 (fsdp) on 2 gloo CPU processes: each
rank's peak memory beside one process's, the bytes communicated per step, and the
planner's bytes per device against the measurement, for each optimizer.

    python benchmarks/distributed.py [--steps 4] [--quick]

The 69M Llama of benchmarks/memory_techniques.py (hidden 768, 8 layers, 12 heads,
intermediate 2064, vocab 8000, untied head; ``--quick``: hidden 256, 4 layers, vocab 2000)
with random weights and a byte-level tokenizer, saved once; a text file packed into
sequences of 64 tokens; micro-batch 1 per process, no accumulation, ``--steps`` steps of
``memfit.train`` with memory measured on every step (CPU: the tensor tracker's exact live
storages). Optimizers: AdamW, 8-bit AdamW, Adafactor, GaLore (randomized_svd, rank 128 =
hidden / 6, update_gap 2: steps 1 and 3 refresh P from the full gradient, 2 and 4 take
R = P^T G from backward), layer-wise AdamW and GaLore, and AdamW with host offload
(under FSDP2: its CPUOffloadPolicy).

Every case runs three times, each run in processes of its own: on 2 processes under ddp
and under fsdp (torchrun jobs) and on 1 (distributed.strategy=none). Columns: the highest
measured step of each, per rank; ``plan``: ``memfit plan --devices 2``'s bytes per device
for the case's config under that strategy on 2 processes (as ``memfit.plan.estimate``
computes it); ``plan/max``: against the larger rank's peak. Communication: under ddp, the
bytes rank 0 all-reduces per step (``allreduce_bytes`` of metrics.jsonl), for GaLore on
steps that keep P and on those that refresh it; the target: GaLore's keep-P steps
all-reduce at most 0.3 x what AdamW does. Under fsdp, the bytes rank 0 hands to
torch.distributed's collectives per step, counted by wrapping them in the worker
(all-gathers: its shard; reduce-scatters: the whole gradient it reduces; all-reduces: the
tensor), averaged over the steps; the final checkpoint's few metadata exchanges included.

Host offload is measured on CPU too: what memfit and FSDP2's CPUOffloadPolicy keep on the
host (master copies or shards, gradients, state) is the tracker's host pool, not the
device's peak (docs/planner.md, "Host memory").

Runtime on 2 CPU cores: about 8 minutes (measured 7 min 48 s), most of it starting 21
runs, loading the model in each process and writing each run's final checkpoint.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from memfit.bench.process import CaseFailed, add_case_arguments, run_in_own_process, write_result
from memfit.bench.random_llama import LLAMA_69M, LlamaShape, llama_config, save_random_model
from memfit.bench.table import text_table
from memfit.config.schema import Config

MIB = 2**20
SEQUENCE, STEPS, UPDATE_GAP, LR = 64, 4, 2, 1e-4
QUICK = LlamaShape(hidden=256, layers=4, heads=4, intermediate=688, vocab=2000)
GALORE = {"optimizer.name": "galore", "optimizer.galore.projector": "randomized_svd",
          "optimizer.galore.update_gap": UPDATE_GAP}
CASES: dict[str, dict[str, Any]] = {
    "adamw": {"optimizer.name": "adamw"},
    "adamw8bit": {"optimizer.name": "adamw8bit"},
    "adafactor": {"optimizer.name": "adafactor"},
    "galore randomized_svd": GALORE,
    "layer-wise adamw": {"optimizer.name": "adamw", "optimizer.layerwise": True},
    "layer-wise galore": {**GALORE, "optimizer.layerwise": True},
    "adamw + host offload": {"optimizer.name": "adamw", "memory.optimizer_offload": True},
}
ADAMW, GALORE_CASES = "adamw", ("galore randomized_svd", "layer-wise galore")
# (distributed.strategy, processes) of every case's runs
RUNS = (("ddp", 2), ("fsdp", 2), ("none", 1))
# torch.distributed collective -> its argument holding the tensor a process hands to it
_SENT = {"all_gather_single": "input_tensor", "all_gather_into_tensor": "input_tensor",
         "all_gather": "tensor", "reduce_scatter_single": "input",
         "reduce_scatter_tensor": "input", "all_reduce": "tensor"}


def galore_rank(shape: LlamaShape) -> int:
    return shape.hidden // 6  # 128 for the 69M model, as benchmarks/optimizers.py


def case_config(case: str, folder: Path, strategy: str, processes: int, steps: int,
                shape: LlamaShape, output_dir: Path) -> Config:
    """What the case trains: its optimizer settings on the shared model, data and steps."""
    from memfit.config.load import parse_overrides
    from memfit.techniques.config_checks import from_mapping

    settings = {
        "model.path": folder / "model", "data.path": folder / "text.txt",
        "data.format": "text", "data.max_length": SEQUENCE, "data.eval_fraction": 0.0,
        "train.micro_batch_size": 1, "train.max_steps": steps, "train.output_dir": output_dir,
        "optimizer.lr": LR, "log.progress": False, "log.tensorboard": False,
        "log.memory_every": 1, "distributed.strategy": strategy,
        "distributed.nproc": processes, **CASES[case]}
    if settings["optimizer.name"] == "galore":
        settings["optimizer.galore.rank"] = galore_rank(shape)
    return from_mapping(parse_overrides([f"{key}={value}" for key, value in settings.items()]))


def write_inputs(folder: Path, shape: LlamaShape) -> int:
    """The model (with a byte-level tokenizer) and the text; returns the parameter count."""
    from memfit.models.tokenizers import byte_level_tokenizer

    words = ["north", "amber", "quartz", "meadow", "signal", "harbor", "linen", "cedar"]
    (folder / "text.txt").write_text("\n".join(
        " ".join(words[(row * 3 + k) % len(words)] for k in range(40)) for row in range(64)))
    return save_random_model(folder / "model", llama_config(shape), byte_level_tokenizer())


def count_sent_bytes() -> list[int]:
    """Wrap torch.distributed's collectives (looked up by FSDP2 and memfit at each call) so
    that each call adds the bytes this process hands to it; returns the running total."""
    import torch.distributed as dist

    sent = [0]

    def counting(collective, argument: str):
        signature = inspect.signature(collective)

        def wrapper(*args, **kwargs):
            tensor = signature.bind(*args, **kwargs).arguments[argument]
            sent[0] += tensor.numel() * tensor.element_size()
            return collective(*args, **kwargs)

        return wrapper

    for name, argument in _SENT.items():
        setattr(dist, name, counting(getattr(dist, name), argument))
    return sent


def child(arguments: argparse.Namespace, shape: LlamaShape) -> None:
    """One rank of one run: train, and hand back this rank's peak (and under fsdp, the
    bytes it handed to collectives per step)."""
    from memfit.training.api import train

    rank = int(os.environ.get("RANK", "0"))
    config = case_config(arguments.case, Path(arguments.model), arguments.strategy,
                         arguments.processes, arguments.steps, shape, arguments.out)
    sent = count_sent_bytes()
    result = train(config)
    write_result(rank_result(arguments.result, rank),
                 {"peak_bytes": result.peak_bytes, "sent_per_step": sent[0] / arguments.steps})


def rank_result(result: Path, rank: int) -> Path:
    return result.with_name(f"{result.stem}.rank-{rank}.json")


def run(case: str, folder: Path, strategy: str, processes: int, steps: int,
        quick: bool) -> dict[str, Any]:
    """Train ``case`` under ``strategy`` on ``processes`` processes; each rank's peak, rank
    0's records and the bytes it handed to collectives per step."""
    from memfit.monitor.metrics import read_metrics

    name = f"{case.replace(' ', '-').replace('+', 'with')}-{strategy}-{processes}"
    out, result = folder / "runs" / name, folder / "results" / f"{name}.json"
    launcher = (["-m", "torch.distributed.run", "--standalone",
                 f"--nproc-per-node={processes}", "--max-restarts=0"] if processes > 1 else [])
    first = run_in_own_process(
        [*launcher, __file__, "--child", "--case", case, "--model", str(folder),
         "--strategy", strategy, "--processes", str(processes), "--steps", str(steps),
         "--out", str(out), "--result", str(result), *(["--quick"] if quick else [])],
        rank_result(result, 0), log=folder / "logs" / f"{name}.log")
    peaks = [first["peak_bytes"]] + [
        json.loads(rank_result(result, rank).read_text())["peak_bytes"]
        for rank in range(1, processes)]
    return {"peaks": peaks, "records": [r for r in read_metrics(out) if "loss" in r],
            "sent_per_step": first["sent_per_step"]}


def refreshes(step: int) -> bool:
    """GaLore takes a new P on steps 1, 1 + update_gap, ..."""
    return (step - 1) % UPDATE_GAP == 0


def reduced(records: list[dict[str, Any]], refresh: bool) -> float | None:
    values = [r["allreduce_bytes"] for r in records if refreshes(r["step"]) == refresh]
    return statistics.fmean(values) if values else None


def mib(value: float | None) -> str:
    return f"{value / MIB:.2f}" if value is not None else "-"


def report(results: dict[str, dict[str, dict]], planned: dict[str, dict[str, int]]) -> None:
    rows = []
    for case, runs in results.items():
        ddp, one = runs["ddp"], runs["none"]
        galore = case in GALORE_CASES
        plan = planned[case]["ddp"]
        rows.append([case, mib(one["peaks"][0]), *(mib(peak) for peak in ddp["peaks"]),
                     mib(plan), f"{plan / max(ddp['peaks']):.3f}",
                     mib(reduced(ddp["records"], refresh=False) if galore
                         else statistics.fmean(r["allreduce_bytes"] for r in ddp["records"])),
                     mib(reduced(ddp["records"], refresh=True)) if galore else "-"])
    print(text_table([("optimizer", 24), ("1 process", 11), ("ddp rank 0", 12),
                      ("ddp rank 1", 12), ("plan", 10), ("plan/max", 10),
                      ("reduced/step", 14), ("refresh step", 14)], rows))
    print("(MiB; peaks: the highest measured step's live tensor bytes; reduced/step: rank "
          "0's all-reduced bytes per step, for GaLore on steps that keep P)")
    rows = []
    for case, runs in results.items():
        fsdp, one = runs["fsdp"], runs["none"]
        plan = planned[case]["fsdp"]
        rows.append([case, mib(one["peaks"][0]), *(mib(peak) for peak in fsdp["peaks"]),
                     f"{max(fsdp['peaks']) / one['peaks'][0]:.3f}", mib(plan),
                     f"{plan / max(fsdp['peaks']):.3f}", mib(fsdp["sent_per_step"])])
    print(text_table([("optimizer", 24), ("1 process", 11), ("fsdp rank 0", 12),
                      ("fsdp rank 1", 12), ("max/1 proc", 11), ("plan", 10),
                      ("plan/max", 10), ("sent/step", 11)], rows))
    print("(MiB; sent/step: the bytes rank 0 handed to collectives per step under fsdp)")
    if ADAMW not in results:
        return
    adamw = statistics.fmean(r["allreduce_bytes"] for r in results[ADAMW]["ddp"]["records"])
    for case in GALORE_CASES:
        if case in results:
            ratio = reduced(results[case]["ddp"]["records"], refresh=False) / adamw
            print(f"{case}: all-reduced on steps that keep P / adamw's = {ratio:.3f} "
                  f"(target <= 0.3: {'met' if ratio <= 0.3 else 'NOT met'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_case_arguments(parser)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--quick", action="store_true", help="a 4-layer model of hidden 256")
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    shape = QUICK if arguments.quick else LLAMA_69M
    if arguments.child:
        child(arguments, shape)
        return
    from memfit.plan import estimate

    # Removed at the end: each run's final checkpoint of the 69M model is ~0.8 GB.
    with tempfile.TemporaryDirectory(prefix="memfit-distributed-") as name:
        folder = Path(name)
        parameters = write_inputs(folder, shape)
        print(f"Llama {parameters / 1e6:.1f}M parameters, micro-batch 1 x {SEQUENCE} tokens "
              f"per process, {arguments.steps} steps, GaLore rank {galore_rank(shape)}")
        results: dict[str, dict[str, dict]] = {}
        planned: dict[str, dict[str, int]] = {}
        for case in CASES:
            try:
                results[case] = {strategy: run(case, folder, strategy, processes,
                                               arguments.steps, arguments.quick)
                                 for strategy, processes in RUNS}
            except CaseFailed as error:
                print(f"{case}: failed: {error.last_line}")
                continue
            planned[case] = {strategy: estimate(case_config(
                case, folder, strategy, 2, arguments.steps, shape, folder / "unused"),
                device="cpu").peak_tensor_bytes for strategy in ("ddp", "fsdp")}
    report(results, planned)


if __name__ == "__main__":
    main()
