"""The shipped demo assets load offline and the base model really is pretrained."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from memfit.demo import demo_assets_dir
from memfit.models.tokenizers import BOS_ID, EOS_ID, PAD_ID

ASSETS = demo_assets_dir()
BASE = ASSETS / "base"


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return AutoTokenizer.from_pretrained(BASE, local_files_only=True)


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(BASE, local_files_only=True).eval()


@pytest.fixture(scope="module")
def corpus_paragraphs() -> list[str]:
    text = (ASSETS / "corpus.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def instruction_rows() -> list[dict[str, str]]:
    lines = (ASSETS / "instructions.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_assets_folder_is_complete_and_small() -> None:
    assert (ASSETS / "corpus.txt").is_file()
    assert (ASSETS / "instructions.jsonl").is_file()
    for name in ("config.json", "generation_config.json", "model.safetensors",
                 "tokenizer.json", "tokenizer_config.json"):
        assert (BASE / name).is_file(), name
    assert sum(path.stat().st_size for path in BASE.iterdir()) < 6 * 2**20


def test_model_and_tokenizer_agree(model: PreTrainedModel,
                                   tokenizer: PreTrainedTokenizerFast) -> None:
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.tie_word_embeddings
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (
        PAD_ID, BOS_ID, EOS_ID)
    assert (model.config.bos_token_id, model.config.eos_token_id) == (BOS_ID, EOS_ID)
    assert tokenizer.chat_template


def test_tokenizer_round_trips_the_corpus(tokenizer: PreTrainedTokenizerFast,
                                          corpus_paragraphs: list[str]) -> None:
    for paragraph in corpus_paragraphs:
        assert tokenizer.decode(tokenizer.encode(paragraph)) == paragraph
    # BPE trained on the corpus compresses it well beyond one token per byte.
    text = " ".join(corpus_paragraphs[:20])
    assert len(tokenizer.encode(text)) < len(text) / 2.5


def test_instruction_rows_are_complete(instruction_rows: list[dict[str, str]],
                                       tokenizer: PreTrainedTokenizerFast) -> None:
    assert 300 <= len(instruction_rows) <= 2000
    for row in instruction_rows:
        assert set(row) == {"prompt", "response"}
        assert row["prompt"].strip() and row["response"].strip()
        assert row["response"] not in row["prompt"]
    longest = max(
        len(tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]},
             {"role": "assistant", "content": row["response"]}],
            tokenize=True, return_dict=True)["input_ids"])
        for row in instruction_rows)
    assert longest <= 128


def test_base_model_is_pretrained_on_the_corpus(model: PreTrainedModel,
                                                tokenizer: PreTrainedTokenizerFast,
                                                corpus_paragraphs: list[str]) -> None:
    # Title, body and moral of the first fable, as the model saw it in pretraining.
    passage = "\n\n".join(corpus_paragraphs[:3])
    ids = torch.tensor([[BOS_ID, *tokenizer.encode(passage)]])
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    # An untrained model scores about log(vocab) ~ 6.9 nats; a pretrained one far less.
    assert loss < 0.5 * math.log(len(tokenizer))


def test_assets_dir_is_a_real_folder() -> None:
    assert isinstance(ASSETS, Path) and ASSETS.is_dir()
