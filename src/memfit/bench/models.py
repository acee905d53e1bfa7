"""The models ``memfit bench --model`` offers, each written once as a Hugging Face folder
so that every case — memfit's and the peers' — loads exactly the same weights.

- ``demo-base`` (default): the shipped pretrained ~1M-parameter Llama and its instruction
  set, so losses fall for a reason and the whole suite fits a 2-core CPU;
- ``tiny-llama``: the random-init ~0.1M-parameter preset (tests);
- ``llama-1b``: a random-init 1.1B Llama (TinyLlama-1.1B's shape), bf16, CUDA only
  (benchmarks/gpu_check.sh).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from memfit._utils.errors import ConfigError
from memfit.bench.random_llama import LlamaShape, llama_config, save_random_model
from memfit.demo import demo_assets_dir


@dataclass(frozen=True)
class BenchModel:
    description: str
    data_file: str  # in the demo assets
    data_format: str
    max_length: int
    micro_batch_size: int
    precision: str  # of the cases that do not set their own
    needs_cuda: bool = False


MODELS: dict[str, BenchModel] = {
    "demo-base": BenchModel("demo-base: pretrained Llama, hidden 128, 4 layers, vocab 1024",
                            "instructions.jsonl", "instruction", 128, 8, "fp32"),
    "tiny-llama": BenchModel("tiny-llama: random-init Llama, hidden 64, 2 layers, byte vocab",
                             "instructions.jsonl", "instruction", 64, 4, "fp32"),
    "llama-1b": BenchModel("llama-1b: random-init Llama, hidden 2048, 22 layers, vocab 32000",
                           "corpus.txt", "text", 512, 4, "bf16", needs_cuda=True),
}


# TinyLlama-1.1B's shape.
LLAMA_1B = LlamaShape(hidden=2048, layers=22, heads=32, intermediate=5632, vocab=32000,
                      kv_heads=4, max_positions=2048, pad_token_id=0)


def bench_model(name: str, device: torch.device) -> BenchModel:
    if name not in MODELS:
        raise ConfigError(f"--model {name!r} is not one of: {', '.join(MODELS)}")
    model = MODELS[name]
    if model.needs_cuda and device.type != "cuda":
        raise ConfigError(f"--model {name} needs a CUDA GPU (torch.cuda.is_available() is "
                          f"False here); on CPU use --model demo-base or tiny-llama")
    return model


def materialize(name: str, out: Path) -> tuple[Path, Path]:
    """(model folder, data file) for ``name``; random-init models are written under
    ``out`` once (reused when already there)."""
    assets = demo_assets_dir()
    data = assets / MODELS[name].data_file
    if name == "demo-base":
        return assets / "base", data
    folder = out / "model" / name
    if (folder / "config.json").is_file():
        return folder, data
    if name == "tiny-llama":
        from memfit.models.presets import tiny_llama
        from memfit.models.tokenizers import byte_level_tokenizer

        save_random_model(folder, tiny_llama(), byte_level_tokenizer())
    else:  # llama-1b: the demo's BPE tokenizer (its ids fit the larger vocabulary)
        from transformers import AutoTokenizer

        save_random_model(folder, llama_config(LLAMA_1B),
                          AutoTokenizer.from_pretrained(assets / "base"))
    return folder, data
