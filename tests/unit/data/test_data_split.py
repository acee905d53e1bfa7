"""The eval split: seeded, disjoint, made of whole documents before packing."""

from __future__ import annotations

import pytest

from memfit._utils.errors import DataError
from memfit.data import build_datasets

# Each document is its own number word, so decoding a block shows which documents it holds.
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
DOCS = [f"{WORDS[i % 10]} {WORDS[i // 10]}" for i in range(40)]


def documents(splits_part, tokenizer) -> list[str]:
    """The documents in a split, recovered from its (possibly packed) examples."""
    text = "".join(tokenizer.decode(example["input_ids"]) for example in splits_part)
    return [doc.removeprefix("<s>") for doc in text.split("</s>") if doc]


@pytest.mark.parametrize("pack", [False, True])
def test_split_is_disjoint_complete_sized_and_seeded(pack, tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"text": doc} for doc in DOCS])
    config = cfg(path, "text", eval_fraction=0.25, pack=pack, max_length=16)
    first = build_datasets(config, tokenizer, seed=7)
    train, held_out = documents(first.train, tokenizer), documents(first.eval, tokenizer)
    assert len(held_out) == 10 and sorted(train + held_out) == sorted(DOCS)
    again = build_datasets(config, tokenizer, seed=7)
    assert documents(again.eval, tokenizer) == held_out
    other = build_datasets(config, tokenizer, seed=8)
    assert documents(other.eval, tokenizer) != held_out


def test_a_fraction_above_zero_holds_out_at_least_one_row(tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"text": doc} for doc in DOCS[:3]])
    splits = build_datasets(cfg(path, "text", eval_fraction=0.01), tokenizer)
    assert (len(splits.train), len(splits.eval)) == (2, 1)


def test_one_row_cannot_be_split(tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"text": DOCS[0]}])
    with pytest.raises(DataError, match=r"data.eval_fraction=0.5 needs at least 2 rows"):
        build_datasets(cfg(path, "text", eval_fraction=0.5), tokenizer)
