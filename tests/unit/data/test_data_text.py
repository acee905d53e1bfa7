"""Format "text": every file type, packing, truncation."""

from __future__ import annotations

import datasets
import pandas as pd
import pytest
import torch

from memfit.data import build_datasets

DOCS = ["the cat sat on the mat.", "the dog ate the bone.", "hello there, how are you?"]


def doc_tokens(tokenizer, text: str) -> list[int]:
    return [tokenizer.bos_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"], 2]


def write(kind: str, tmp_path, jsonl) -> str:
    """DOCS as a data file (or folder) of the given kind, in a 'text' column."""
    if kind == "jsonl":
        return jsonl(tmp_path / "d.jsonl", [{"text": doc} for doc in DOCS])
    if kind == "json":
        path = tmp_path / "d.json"
        pd.DataFrame({"text": DOCS}).to_json(path, orient="records")
        return str(path)
    if kind == "csv":
        pd.DataFrame({"text": DOCS}).to_csv(tmp_path / "d.csv", index=False)
        return str(tmp_path / "d.csv")
    if kind == "parquet":
        pd.DataFrame({"text": DOCS}).to_parquet(tmp_path / "d.parquet")
        return str(tmp_path / "d.parquet")
    if kind == "txt":
        # Paragraphs separated by blank lines; the first spans two lines.
        text = "the cat sat\non the mat.\n\n\nthe dog ate the bone.\n\nhello there, how are you?\n"
        (tmp_path / "d.txt").write_text(text)
        return str(tmp_path / "d.txt")
    if kind == "saved":
        datasets.Dataset.from_dict({"text": DOCS}).save_to_disk(tmp_path / "saved")
        return str(tmp_path / "saved")
    if kind == "saved_dict":
        split = datasets.Dataset.from_dict({"text": DOCS})
        datasets.DatasetDict({"train": split}).save_to_disk(tmp_path / "saved_dict")
        return str(tmp_path / "saved_dict")
    assert kind == "folder"
    (tmp_path / "folder").mkdir()
    jsonl(tmp_path / "folder" / "a.jsonl", [{"text": doc} for doc in DOCS[:2]])
    jsonl(tmp_path / "folder" / "b.jsonl", [{"text": DOCS[2]}])
    return str(tmp_path / "folder")


@pytest.mark.parametrize(
    "kind", ["jsonl", "json", "csv", "parquet", "txt", "saved", "saved_dict", "folder"]
)
def test_one_example_per_document_from_every_file_type(kind, tmp_path, tokenizer, cfg, jsonl):
    splits = build_datasets(cfg(write(kind, tmp_path, jsonl), "text"), tokenizer)
    assert len(splits.train) == 3 and len(splits.eval) == 0
    expected = ["the cat sat\non the mat." if kind == "txt" else DOCS[0], *DOCS[1:]]
    for example, text in zip(splits.train, expected, strict=True):
        ids = example["input_ids"]
        assert ids.dtype == torch.long and ids.dim() == 1
        assert ids.tolist() == doc_tokens(tokenizer, text)
        assert torch.equal(example["labels"], ids)
        assert example["attention_mask"].tolist() == [1] * len(ids)


def test_packing_cuts_all_documents_into_full_blocks(tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"text": doc} for doc in DOCS * 3])
    splits = build_datasets(cfg(path, "text", pack=True, max_length=8), tokenizer)
    stream = [token for doc in DOCS * 3 for token in doc_tokens(tokenizer, doc)]
    lengths = [len(example["input_ids"]) for example in splits.train]
    assert all(length == 8 for length in lengths[:-1]) and 0 < lengths[-1] <= 8
    joined = torch.cat([example["input_ids"] for example in splits.train]).tolist()
    assert joined == stream  # nothing lost, order kept, eos between documents
    assert torch.cat([example["labels"] for example in splits.train]).tolist() == stream


def test_without_packing_documents_are_truncated(tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"text": doc} for doc in DOCS])
    splits = build_datasets(cfg(path, "text", max_length=4), tokenizer)
    assert [example["input_ids"].tolist() for example in splits.train] == [
        doc_tokens(tokenizer, doc)[:4] for doc in DOCS
    ]


def test_text_field_names_the_column(tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"body": doc, "text": 3} for doc in DOCS])
    splits = build_datasets(cfg(path, "text", text_field="body"), tokenizer)
    assert splits.train[1]["input_ids"].tolist() == doc_tokens(tokenizer, DOCS[1])
