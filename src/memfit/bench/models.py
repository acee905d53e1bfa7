"""The models ``memfit bench --model`` offers, each written once as a Hugging Face folder
so that every case — memfit's and the peers' — loads exactly the same weights.

- ``demo-base`` (default): the shipped pretrained ~1M-parameter Llama and its instruction
  set, so losses fall for a reason and the whole suite fits a 2-core CPU;
- ``tiny-llama``: the random-init ~0.1M-parameter preset (tests);
- ``llama-1b``: a random-init 1.1B Llama (TinyLlama-1.1B's shape), bf16, CUDA only
  (benchmarks/gpu_check.sh).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memfit._utils.atomic import staged_folder
from memfit._utils.errors import ConfigError
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


def bench_model(name: str, device: torch.device) -> BenchModel:
    if name not in MODELS:
        raise ConfigError(f"--model {name!r} is not one of: {', '.join(MODELS)}")
    model = MODELS[name]
    if model.needs_cuda and device.type != "cuda":
        raise ConfigError(f"--model {name} needs a CUDA GPU (torch.cuda.is_available() is "
                          f"False here); on CPU use --model demo-base or tiny-llama")
    return model


def _llama_1b():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                       num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                       max_position_embeddings=2048, tie_word_embeddings=False,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _random_init(build_config: Callable[[], Any], tokenizer: Any, folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(build_config())
    with staged_folder(folder) as staging:  # an interrupted write leaves no half folder
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)


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

        _random_init(tiny_llama, byte_level_tokenizer(), folder)
    else:  # llama-1b: the demo's BPE tokenizer (its ids fit the larger vocabulary)
        from transformers import AutoTokenizer

        _random_init(_llama_1b, AutoTokenizer.from_pretrained(assets / "base"), folder)
    return folder, data
