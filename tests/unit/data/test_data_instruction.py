"""Format "instruction": the template, masking, both layouts, dropping long prompts."""

from __future__ import annotations

import pandas as pd
import pytest

from memfit._utils.errors import DataError
from memfit.data import IGNORE_INDEX, build_datasets

ROWS = [
    {"prompt": "what is two plus two?", "response": "four."},
    {"prompt": "translate to french: good morning.", "response": "bonjour."},
]


def learned(example) -> list[int]:
    return [label for label in example["labels"].tolist() if label != IGNORE_INDEX]


def test_only_response_and_eos_are_learned(tmp_path, tokenizer, cfg, jsonl):
    splits = build_datasets(cfg(jsonl(tmp_path / "d.jsonl", ROWS), "instruction"), tokenizer)
    for example, row in zip(splits.train, ROWS, strict=True):
        response = tokenizer(row["response"], add_special_tokens=False)["input_ids"]
        assert learned(example) == response + [tokenizer.eos_token_id]
        assert tokenizer.decode(learned(example)) == row["response"] + "</s>"
        # Template: [bos] prompt "\n" | response [eos]; labels unshifted, masked on the left.
        assert (
            tokenizer.decode(example["input_ids"]) == f"<s>{row['prompt']}\n{row['response']}</s>"
        )
        masked = len(example["labels"]) - len(learned(example))
        assert example["labels"][:masked].tolist() == [IGNORE_INDEX] * masked
        assert example["labels"][masked:].tolist() == example["input_ids"][masked:].tolist()


def test_instruction_input_output_layout(tmp_path, tokenizer, cfg):
    frame = pd.DataFrame(
        {
            "instruction": ["translate to french:", "say hello."],
            "input": ["good morning.", ""],
            "output": ["bonjour.", "hello there"],
        }
    )
    frame.to_csv(tmp_path / "alpaca.csv", index=False)
    splits = build_datasets(cfg(tmp_path / "alpaca.csv", "instruction"), tokenizer)
    texts = [tokenizer.decode(example["input_ids"]) for example in splits.train]
    # An empty input (read from CSV as missing) leaves the instruction alone as the prompt.
    assert texts == [
        "<s>translate to french:\n\ngood morning.\nbonjour.</s>",
        "<s>say hello.\nhello there</s>",
    ]
    assert tokenizer.decode(learned(splits.train[0])) == "bonjour.</s>"


def test_rows_whose_prompt_fills_max_length_are_dropped_with_a_warning(
    tmp_path, tokenizer, cfg, jsonl
):
    rows = [*ROWS, {"prompt": "the cat sat on the mat. " * 10, "response": "yes."}]
    path = jsonl(tmp_path / "d.jsonl", rows)
    with pytest.warns(UserWarning, match=r"dropped 1 of 3 rows .*data.max_length=24"):
        splits = build_datasets(cfg(path, "instruction", max_length=24), tokenizer)
    assert len(splits.train) == 2
    assert all(len(example["input_ids"]) <= 24 for example in splits.train)


def test_every_row_dropped_is_an_error_naming_max_length(tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(DataError, match=r"data.max_length=3"):
        build_datasets(cfg(path, "instruction", max_length=3), tokenizer)
