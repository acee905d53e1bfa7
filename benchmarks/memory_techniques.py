"""Peak tensor bytes of memfit's memory techniques against plain PEFT + bitsandbytes.

    python benchmarks/memory_techniques.py [--steps 3] [--device cpu|cuda]

A Llama-architecture model (hidden 768, 8 layers, 12 heads, intermediate 2064, vocab
8000, untied head: 69.2M parameters) with random weights, saved once as a Hugging Face
folder; batch 1 x sequence 128 of fixed random tokens. Every case runs in its own
process, trains ``--steps`` AdamW steps (lr 1e-4) on the same batch and reports the
peak of its highest step, split by category, measured by memfit's memory meter (CPU:
exact live tensor storages; CUDA: torch.cuda allocator peak). LoRA everywhere: r=16,
alpha=32, dropout 0, all linear layers but the head. Peers use the documented PEFT
recipe: ``get_peft_model``, ``prepare_model_for_kbit_training`` for 4-bit bases,
transformers' non-reentrant checkpointing, ``model(..., labels=...).loss``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from memfit.bench.cases import Case
from memfit.bench.process import CaseFailed, add_case_arguments, run_script_case, write_result
from memfit.bench.random_llama import LLAMA_69M, llama_config, save_random_model, token_batch
from memfit.bench.script_case import case_config, memfit_training, peer_training
from memfit.bench.table import text_table
from memfit.config.ignored import flatten
from memfit.techniques.registry import TECHNIQUES

MIB = 2**20
RANK, ALPHA, LR, SEQUENCE = 16, 32.0, 1e-4, 128
CATEGORIES = ("weights", "grads", "optimizer", "activations", "temporaries")

_LORA = {"adapter.kind": "lora"}
_CKPT = {"memory.gradient_checkpointing": True}
_QLORA = {"adapter.kind": "qlora", "precision": "bf16"}
# The peers keep torch AdamW's default weight_decay, 0.01 (memfit's is 0).
_PEFT = {"optimizer.weight_decay": 0.01}
CASES = [
    Case("full AdamW fp32 (baseline)", {}),
    Case("full AdamW + checkpointing", _CKPT),
    # Every technique whose spec brings its own case (a new one included).
    *(Case(spec.name, flatten(spec.plan_case)) for spec in TECHNIQUES if spec.plan_case),
    Case("LoRA r16 all-linear", _LORA),
    Case("LoRA + checkpointing", {**_LORA, **_CKPT}),
    Case("LoRA + ckpt + chunked loss, bf16", {**_LORA, **_CKPT, "memory.chunked_loss": True,
                                              "precision": "bf16"}),
    Case("QLoRA nf4+dq, bf16", _QLORA),
    Case("QLoRA + ckpt + chunked + act. offload", {
        **_QLORA, **_CKPT, "memory.chunked_loss": True, "memory.activation_offload": True}),
    Case("peer: PEFT LoRA", {**_PEFT, **_LORA}, peer="peft"),
    Case("peer: PEFT LoRA + checkpointing", {**_PEFT, **_LORA, **_CKPT}, peer="peft"),
    Case("peer: PEFT LoRA + ckpt, bf16 autocast", {**_PEFT, **_LORA, **_CKPT, "precision": "bf16"},
         peer="peft"),
    Case("peer: PEFT QLoRA, bf16", {**_PEFT, **_QLORA}, peer="peft"),
    Case("peer: PEFT QLoRA + ckpt, bf16", {**_PEFT, **_QLORA, **_CKPT}, peer="peft"),
]
BEST_LORA, PEER_LORA = "LoRA + ckpt + chunked loss, bf16", "peer: PEFT LoRA + ckpt, bf16 autocast"
PEER_LORA_FP32 = "peer: PEFT LoRA + checkpointing"
BEST_QLORA, PEER_QLORA = "QLoRA + ckpt + chunked + act. offload", "peer: PEFT QLoRA, bf16"


def run_case(case: Case, folder: Path, steps: int, device: torch.device) -> dict:
    from memfit.monitor.memory import make_memory_meter
    from memfit.techniques.activation_offload import ActivationOffload
    from memfit.techniques.precision import autocast
    from memfit.techniques.specs.chunked_loss import chunk_tokens
    from memfit.training.objective import Objective

    config = case_config(folder, {"adapter.rank": RANK, "adapter.alpha": ALPHA,
                                  "optimizer.lr": LR, "adapter.targets": "[all-linear]",
                                  **case.overrides})
    if case.peer is None:
        built = memfit_training(config, device)
        objective = Objective(causal_lm=True, loss_chunk_tokens=chunk_tokens(config.memory))

        def loss_fn(data):
            return objective.loss_sum(built.model, data) / objective.count(data)
    else:
        built = peer_training(case.peer, folder, config, device)

        def loss_fn(data):
            return built.model(**data).loss

    model, optimizer = built.model, built.optimizer
    model.train()
    data = token_batch(LLAMA_69M.vocab, SEQUENCE, device)
    meter = make_memory_meter(device)
    meter.attach(model, optimizer)
    offloader = ActivationOffload(device)
    losses = []
    for _ in range(steps):
        with meter.step():
            with autocast(config.precision, device), \
                    offloader.context(config.memory.activation_offload):
                loss = loss_fn(data)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            del loss
    peak = meter.peak
    host = optimizer.host_bytes() if hasattr(optimizer, "host_bytes") else 0
    return {"peak": peak.peak_bytes, **peak.by_category, "loss": losses[-1],
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "host_bytes": host}


def kbit_preparation(folder: Path) -> dict:
    """Weight bytes of a bf16-loaded 4-bit model before and after PEFT's preparation."""
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=quantization,
                                                 dtype=torch.bfloat16)

    def weight_bytes() -> int:
        return sum(p.nbytes for p in model.parameters()) + sum(b.nbytes for b in model.buffers())

    before = weight_bytes()
    prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return {"before": before, "after": weight_bytes()}


def child(arguments: argparse.Namespace) -> None:
    folder, device = Path(arguments.model), torch.device(arguments.device)
    result = (kbit_preparation(folder) if arguments.case == "kbit"
              else run_case(next(case for case in CASES if case.name == arguments.case), folder,
                            arguments.steps, device))
    write_result(arguments.result, result)


def spawn(case: str, folder: Path, arguments: argparse.Namespace) -> dict:
    try:
        return run_script_case(__file__, ["--case", case, "--model", str(folder), "--steps",
                                          str(arguments.steps), "--device", arguments.device],
                               folder.parent / "result.json")
    except CaseFailed as failure:
        raise SystemExit(f"case {case!r} failed:\n{failure}") from None


def print_results(results: dict[str, dict]) -> None:
    baseline = results["full AdamW fp32 (baseline)"]["peak"]
    columns = [("case", 40), *((c[:11], 12) for c in CATEGORIES), ("peak MiB", 10),
               ("x base", 8), ("trainable", 11), ("loss@end", 10)]
    print(text_table(columns, [
        [name, *(f"{row[c] / MIB:.1f}" for c in CATEGORIES), f"{row['peak'] / MIB:.1f}",
         f"{row['peak'] / baseline:.3f}", f"{row['trainable']:,}", f"{row['loss']:.4f}"]
        for name, row in results.items()]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    add_case_arguments(parser)
    arguments = parser.parse_args()
    if arguments.child:
        child(arguments)
        return
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary) / "llama-69m"
        parameters = save_random_model(folder, llama_config(LLAMA_69M))
        print(f"model: Llama 768x8, vocab 8000, {parameters / 1e6:.1f}M parameters; batch 1 x "
              f"{SEQUENCE}; {arguments.steps} steps; device {arguments.device}; "
              "bytes are peak live tensor storages (MiB)\n")
        results = {case.name: spawn(case.name, folder, arguments) for case in CASES}
        kbit = spawn("kbit", folder, arguments)
    print_results(results)
    peak = {name: row["peak"] for name, row in results.items()}
    print()
    for ours, peer in [(BEST_LORA, PEER_LORA), (BEST_LORA, PEER_LORA_FP32),
                       (BEST_QLORA, PEER_QLORA)]:
        ratio = peak[ours] / peak[peer]
        verdict = "meets" if ratio <= 0.8 else "MISSES"
        print(f"{ours} / {peer}: {ratio:.3f} ({verdict} target <= 0.8)")
    print(f"\npeft.prepare_model_for_kbit_training on the bf16-loaded 4-bit model: weights "
          f"{kbit['before'] / MIB:.1f} -> {kbit['after'] / MIB:.1f} MiB "
          f"(+{(kbit['after'] - kbit['before']) / MIB:.1f} MiB: non-quantized weights "
          "upcast to fp32); memfit keeps them in their dtype and stores the frozen head in "
          "the compute dtype instead")


if __name__ == "__main__":
    main()
