"""A tiny byte-level BPE tokenizer and a stand-in for the data config, built in-process."""

from __future__ import annotations

import json
import os
import types
from collections.abc import Callable

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# ChatML-like: header line per message, the reply's end marked by eos, a newline after.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CORPUS = [
    "the cat sat on the mat. the dog ate the bone.",
    "what is two plus two? four. hello there, how are you?",
    "translate to french: good morning. bonjour.",
]


def build_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    """Byte-level BPE (any text encodes) with <pad>=0, <s>=1, </s>=2."""
    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    model.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=model, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    tokenizer.chat_template = chat_template
    return tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer(CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def plain_tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer(None)


@pytest.fixture
def make_tokenizer() -> Callable[[str | None], PreTrainedTokenizerFast]:
    """build_tokenizer(chat_template), for a test that needs its own template."""
    return build_tokenizer


def make_cfg(path: str | os.PathLike, format: str, **overrides: object) -> types.SimpleNamespace:
    """Stand-in for memfit.config.schema.DataConfig with the same attributes."""
    fields = {
        "path": str(path),
        "format": format,
        "max_length": 64,
        "eval_fraction": 0.0,
        "eval_path": None,
        "pack": False,
        "text_field": "text",
        "label_field": "label",
    }
    fields.update(overrides)
    return types.SimpleNamespace(**fields)


def write_jsonl(path: str | os.PathLike, rows: list[dict]) -> str:
    with open(path, "w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    return str(path)


@pytest.fixture
def cfg() -> Callable[..., types.SimpleNamespace]:
    """make_cfg(path, format, **overrides)."""
    return make_cfg


@pytest.fixture
def jsonl() -> Callable[[str | os.PathLike, list[dict]], str]:
    """write_jsonl(path, rows) -> path."""
    return write_jsonl
