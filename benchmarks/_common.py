"""What the benchmarks share: the Llama-architecture model they measure, its input batch,
building it through memfit's own pipeline, one process per case, and plain-text tables.

Each case runs in a fresh process so that one case's allocations, caches, thread pools
and imported backends cannot change the next case's bytes or time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

MIB = 2**20
RESULT_PREFIX = "RESULT "


@dataclass(frozen=True)
class LlamaShape:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int


# The model of the memory-techniques issue: untied head, 69.2M parameters.
LLAMA_69M = LlamaShape(hidden=768, layers=8, heads=12, intermediate=2064, vocab=8000)


def llama_config(shape: LlamaShape = LLAMA_69M):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden,
                       intermediate_size=shape.intermediate, num_hidden_layers=shape.layers,
                       num_attention_heads=shape.heads, num_key_value_heads=shape.heads,
                       max_position_embeddings=512, tie_word_embeddings=False)


def save_random_llama(folder: Path, shape: LlamaShape = LLAMA_69M) -> int:
    """Write a seeded random-weight model of ``shape`` as a Hugging Face folder, so every
    case process loads the very same weights; returns its parameter count."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(llama_config(shape))
    model.save_pretrained(folder, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def token_batch(vocab: int, sequence: int, device: torch.device) -> dict[str, torch.Tensor]:
    """One fixed random sequence (batch 1) used as input and labels."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, vocab, (1, sequence), generator=generator)
    return {"input_ids": input_ids.to(device), "labels": input_ids.to(device),
            "attention_mask": torch.ones_like(input_ids).to(device)}


def build_memfit_model(folder: Path, overrides: dict[str, Any]):
    """(Config, model) for the model in ``folder`` after memfit's own preparation steps
    (quantization, checkpointing, adapters); ``overrides`` are ``section.key: value``."""
    from memfit.config import from_mapping
    from memfit.config.load import parse_overrides
    from memfit.training.build import load_base, prepare_model, seed_everything

    # data.path only has to exist: the benchmarks feed their own batch, not a dataset.
    settings = {"model.path": folder, "data.path": folder, **overrides}
    config = from_mapping(parse_overrides([f"{key}={value}" for key, value in settings.items()]))
    seed_everything(0)
    model, _ = prepare_model(load_base(config), config)
    return config, model


class CaseFailed(RuntimeError):
    """A case's process exited with an error or printed no result."""


def add_case_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark takes: --device, and the hidden ones its per-case child
    process is started with (see run_in_subprocess)."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)


def report(result: dict[str, Any]) -> None:
    """Called in a case's process: hand ``result`` (JSON-able) to the parent."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def run_in_subprocess(script: str | Path, arguments: Sequence[str]) -> dict[str, Any]:
    """Run ``script --child ARGUMENTS`` in a new interpreter and return what it reported."""
    command = [sys.executable, str(script), "--child", *arguments]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise CaseFailed(done.stderr[-3000:] or f"exit status {done.returncode}, no result")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def print_table(columns: Sequence[tuple[str, int]], rows: Iterable[Sequence[str]]) -> None:
    """``columns`` are (title, width); the first is left-aligned, the others right."""
    (first, first_width), rest = columns[0], columns[1:]

    def line(cells: Sequence[str]) -> str:
        return f"{cells[0]:<{first_width}}" + "".join(
            f"{cell:>{width}}" for cell, (_, width) in zip(cells[1:], rest, strict=True))

    header = line([first, *(title for title, _ in rest)])
    print(header)
    print("-" * len(header))
    for row in rows:
        print(line(row))
