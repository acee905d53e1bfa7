"""Long sequences measured on CPU against the plan (#37 item 4). Run:
python benchmarks/long_context.py [--lengths 16384,20480] [--parts 1,2]

A small Llama (fp32, hidden 64, MLP 256, 4 layers, 4 heads, 2 key/value heads) trains
for real, one sequence per micro-batch, at each length:

1. One process, checkpointing and chunked loss; + the tiled MLP; + tiled norms;
   + activation offload
   (the checkpointed block inputs in host memory). For each: the plan's and the tensor
   tracker's peak device bytes (the highest of 2 steps), the error, and the bytes each
   extra token costs between the two lengths (planned and measured): with the tiled MLP
   and offload the slope falls, and the plan must stay at or above the measurement,
   within 10%.
2. Sequence parallelism: 2 processes sharing each sequence (``distributed.strategy=ddp``,
   ``distributed.sequence_parallel=2``, ``memfit train --nproc 2``) against one process,
   at the first length, checkpointing, chunked loss and tiled MLP: the peak device bytes
   (and the activations there) of rank 0's tracker (metrics.jsonl), planned and
   measured, and the losses of the 2 steps, which must be the same.

Its output is recorded in docs/planner.md ("Long contexts").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "unit" / "plan"))

from accuracy_cases import config_for, measure_peak  # noqa: E402

from memfit.plan import estimate  # noqa: E402

STEPS = 2
LAYERS = 4  # enough blocks that offloading their checkpointed inputs shows
TECHNIQUES = [  # (name, memory overrides)
    ("ckpt + chunked loss", {"gradient_checkpointing": True, "chunked_loss": True,
                             "loss_chunk_tokens": 1024}),
    ("+ tiled MLP", {"gradient_checkpointing": True, "chunked_loss": True,
                     "loss_chunk_tokens": 1024, "tiled_mlp": True, "mlp_chunk_tokens": 1024}),
    ("+ tiled norms", {"gradient_checkpointing": True, "chunked_loss": True,
                       "loss_chunk_tokens": 1024, "tiled_mlp": True, "mlp_chunk_tokens": 1024,
                       "tiled_norms": True, "norm_chunk_tokens": 1024}),
    ("+ activation offload", {"gradient_checkpointing": True, "chunked_loss": True,
                              "loss_chunk_tokens": 1024, "tiled_mlp": True,
                              "mlp_chunk_tokens": 1024, "tiled_norms": True,
                              "norm_chunk_tokens": 1024, "activation_offload": True}),
]


def write_model_and_text(folder: Path, longest: int) -> dict:
    """The small Llama's folder, a text corpus of a few longest sequences, and the base
    config (YAML-shaped) that trains on it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from memfit.models.tokenizers import BYTE_VOCAB_SIZE, byte_level_tokenizer

    model = folder / "llama-long"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=BYTE_VOCAB_SIZE, hidden_size=64,
                                 intermediate_size=256, num_hidden_layers=LAYERS,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=longest)).save_pretrained(model)
    byte_level_tokenizer().save_pretrained(model)
    corpus = folder / "corpus.txt"  # bytes for (STEPS + 2) sequences of the longest length
    lines = (STEPS + 2) * longest // 48 + 1
    corpus.write_text("\n".join(f"line {i:6d}: the quick brown fox jumps over"
                                for i in range(lines)))
    return {"model": {"path": str(model)},
            "data": {"path": str(corpus), "format": "text", "eval_fraction": 0.0},
            "precision": "fp32",
            "adapter": {"kind": "lora", "rank": 8, "targets": ["attention", "mlp"]},
            "train": {"micro_batch_size": 1, "max_steps": STEPS, "seed": 0},
            "log": {"memory_every": 1}}


def one_process(base: dict, lengths: list[int]) -> None:
    print(f"1. one process, one sequence per micro-batch, peak device bytes over {STEPS} steps")
    print(f"{'techniques':24} {'tokens':>7} {'planned':>13} {'measured':>13} {'error':>7}")
    for name, memory in TECHNIQUES:
        planned, measured = {}, {}
        for length in lengths:
            config = config_for(base, {"data": {"max_length": length}, "memory": memory})
            planned[length] = estimate(config, device="cpu").peak_tensor_bytes
            measured[length] = measure_peak(config, STEPS)[0].peak_bytes
            error = planned[length] / measured[length] - 1
            print(f"{name:24} {length:7d} {planned[length]:13,d} {measured[length]:13,d} "
                  f"{error:+7.1%}", flush=True)
        if len(lengths) > 1:
            short, long = lengths[0], lengths[-1]
            slope = {kind: (found[long] - found[short]) / (long - short)
                     for kind, found in (("planned", planned), ("measured", measured))}
            print(f"{'':24} bytes per extra token: planned {slope['planned']:,.0f}, "
                  f"measured {slope['measured']:,.0f} "
                  f"({slope['planned'] / slope['measured'] - 1:+.1%})")


def _train(folder: Path, config: dict, overrides: list[str], nproc: int) -> list[dict]:
    """metrics.jsonl's step records of ``memfit train`` run as ``nproc`` processes."""
    folder.mkdir(parents=True)
    path = folder / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    run = folder / "run"
    command = [sys.executable, "-m", "memfit", "train", str(path), f"train.output_dir={run}",
               *overrides]
    if nproc > 1:
        command += ["--nproc", str(nproc)]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run(command, check=True, env=environment, capture_output=True, text=True)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text()
               .splitlines()]
    return [record for record in records if "loss" in record and "memory_peak_bytes" in record]


def split_sequences(base: dict, length: int, folder: Path) -> None:
    memory = dict(TECHNIQUES[1][1])
    config = {**base, "data": {**base["data"], "max_length": length}, "memory": memory}
    print(f"\n2. sequence parallelism at {length} tokens ({TECHNIQUES[1][0][2:]}, "
          f"checkpointing, chunked loss): rank 0's peak")
    split = ["distributed.strategy=ddp", "distributed.sequence_parallel=2"]
    runs = {"1 process": ([], 1), "2 sharing each sequence": (split, 2)}
    found = {}
    for name, (overrides, nproc) in runs.items():
        records = _train(folder / name.replace(" ", "-"), config, overrides, nproc)
        planned_config = config_for(config, {"distributed": {
            "strategy": "ddp" if nproc > 1 else "none", "nproc": nproc,
            "sequence_parallel": nproc}})
        planned = estimate(planned_config, device="cpu")
        peak = max(records, key=lambda record: record["memory_peak_bytes"])
        found[name] = peak["memory_peak_bytes"], [r["loss"] for r in records]
        print(f"{name:24} peak: planned {planned.peak_tensor_bytes:13,d} (activations "
              f"{planned.bytes['activations']:,d}), measured {peak['memory_peak_bytes']:13,d} "
              f"(activations {peak['memory_activations_bytes']:,d}) "
              f"({planned.peak_tensor_bytes / peak['memory_peak_bytes'] - 1:+.1%}); losses "
              + ", ".join(f"{loss:.6f}" for loss in found[name][1]), flush=True)
    (whole, whole_losses), (shared, shared_losses) = found.values()
    worst = max(abs(a / b - 1) for a, b in zip(shared_losses, whole_losses, strict=True))
    print(f"each of 2 peaks at {shared / whole:.3f} of one process's bytes; losses differ "
          f"by at most {worst:.1e} (relative)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="16384,20480",
                        help="sequence lengths, comma-separated (default: 16384,20480)")
    parser.add_argument("--parts", default="1,2",
                        help="which parts to run, comma-separated (default: 1,2)")
    args = parser.parse_args()
    lengths = sorted(int(length) for length in args.lengths.split(","))
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        base = write_model_and_text(folder, lengths[-1])
        parts = args.parts.split(",")
        if "1" in parts:
            one_process(base, lengths)
        if "2" in parts:
            split_sequences(base, lengths[0], folder)


if __name__ == "__main__":
    main()
