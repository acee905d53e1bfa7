"""A prompt to answer is laid out as the context of a training example of its format:
the tokens a run saw before the ones it learned to write (oracle: build_datasets)."""

from __future__ import annotations

import pytest

from memfit.config.schema import DataFormat
from memfit.data import IGNORE_INDEX, build_datasets
from memfit.data.prompts import prompt_ids

PROMPT = "what is two plus two?"


def context(example) -> list[int]:
    """The example's tokens before its first learned one."""
    labels = example["labels"].tolist()
    first = next(index for index, label in enumerate(labels) if label != IGNORE_INDEX)
    return example["input_ids"].tolist()[:first]


@pytest.mark.parametrize("templated", [True, False])
def test_chat_prompts_are_the_context_of_a_reply(tmp_path, tokenizer, plain_tokenizer, cfg,
                                                 jsonl, templated):
    tokenizer = tokenizer if templated else plain_tokenizer
    row = {"messages": [{"role": "user", "content": PROMPT},
                        {"role": "assistant", "content": "four."}]}
    example = build_datasets(cfg(jsonl(tmp_path / "d.jsonl", [row]), "chat", max_length=256),
                             tokenizer).train[0]
    assert prompt_ids(tokenizer, DataFormat.CHAT, PROMPT) == context(example)


def test_instruction_prompts_are_the_context_of_a_response(tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"prompt": PROMPT, "response": "four."}])
    example = build_datasets(cfg(path, "instruction"), tokenizer).train[0]
    assert prompt_ids(tokenizer, DataFormat.INSTRUCTION, PROMPT) == context(example)


def test_text_prompts_are_the_start_of_a_document(tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"text": PROMPT}])
    example = build_datasets(cfg(path, "text"), tokenizer).train[0]
    # The whole document is [bos] text [eos]; a prompt to continue has no eos yet.
    assert prompt_ids(tokenizer, DataFormat.TEXT, PROMPT) == example["input_ids"].tolist()[:-1]
