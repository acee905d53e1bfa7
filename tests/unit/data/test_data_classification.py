"""Format "classification": classes from the training rows, every row checked before a
model is built, examples as the tokenizer encodes a text at inference."""

from __future__ import annotations

import pytest
import torch

from memfit._utils.errors import DataError
from memfit.data import build_datasets, classes, collate

ROWS = [
    {"text": "the cat sat on the mat", "label": "pets"},
    {"text": "what is two plus two", "label": "maths"},
    {"text": "the dog ate the bone", "label": "pets"},
    {"text": "four", "label": "maths"},
]


def test_string_labels_are_sorted_names_and_examples_are_the_tokenizers_encoding(
        tmp_path, plain_tokenizer, cfg, jsonl):
    data = cfg(jsonl(tmp_path / "rows.jsonl", ROWS), "classification", max_length=4)
    names = classes(data)
    assert names == ("maths", "pets")
    splits = build_datasets(data, plain_tokenizer, labels=names)
    assert len(splits.train) == 4 and len(splits.eval) == 0
    first = splits.train[0]
    assert first["input_ids"].tolist() == plain_tokenizer(ROWS[0]["text"])["input_ids"][:4]
    assert first["labels"].ndim == 0 and int(first["labels"]) == names.index("pets")
    batch = collate([splits.train[0], splits.train[3]], pad_token_id=0)
    assert batch["labels"].tolist() == [1, 0]  # one class per example, stacked
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, 4)


def test_integer_labels_are_ids_and_model_keys_name_or_widen_them(tmp_path, cfg, jsonl):
    rows = [{"text": "a", "label": 0}, {"text": "b", "label": 2}]
    data = cfg(jsonl(tmp_path / "rows.jsonl", rows), "classification")
    assert classes(data) == ("0", "1", "2")  # an id with no row is still a class
    assert classes(data, num_labels=4) == ("0", "1", "2", "LABEL_3")
    assert classes(data, labels=("cold", "warm", "hot")) == ("cold", "warm", "hot")
    with pytest.raises(DataError, match=r"model.num_labels=2 is fewer than the 3 classes"):
        classes(data, num_labels=2)
    with pytest.raises(DataError, match=r"label 2, which is not one of model.labels"):
        classes(data, labels=("cold", "warm"))


def test_eval_path_is_the_whole_eval_split_and_its_labels_must_be_trained_ones(
        tmp_path, plain_tokenizer, cfg, jsonl):
    train = jsonl(tmp_path / "train.jsonl", ROWS)
    held_out = jsonl(tmp_path / "eval.jsonl", ROWS[:1])
    data = cfg(train, "classification", eval_path=held_out, eval_fraction=0.5)
    splits = build_datasets(data, plain_tokenizer, labels=classes(data))
    assert (len(splits.train), len(splits.eval)) == (4, 1)
    unseen = jsonl(tmp_path / "unseen.jsonl", [{"text": "hello there", "label": "greetings"}])
    with pytest.raises(DataError, match=r"unseen.jsonl row 1: label 'greetings' is not one of "
                                        r"the classes the model trains on \(maths, pets"):
        classes(cfg(train, "classification", eval_path=unseen))


def test_classes_come_from_the_training_split_only(tmp_path, cfg, jsonl):
    rows = [{"text": str(index), "label": "common"} for index in range(9)]
    rows.insert(4, {"text": "rare", "label": "rare"})
    path = jsonl(tmp_path / "rows.jsonl", rows)
    rare_held_out = next(seed for seed in range(50) if "rare" not in _train_labels(
        cfg(path, "classification", eval_fraction=0.1), seed))
    with pytest.raises(DataError, match=r"one class \('common' in all 9 rows\)"):
        classes(cfg(path, "classification", eval_fraction=0.1), seed=rare_held_out)


def _train_labels(data, seed: int) -> set[str]:
    from memfit.data.build import row_splits

    train, _ = row_splits(data, seed)
    return {row.values["label"] for rows in train.batches() for row in rows}


@pytest.mark.parametrize("rows, message", [
    ([{"text": "a", "label": "x"}, {"text": "b", "label": True}],
     r"row 2: label True in 'label' is a bool; a label is an integer"),
    ([{"text": "a", "label": "x"}, {"text": "b", "label": -1}], r"row 2: label -1 is a negative"),
    ([{"text": "a", "label": "x"}, {"text": "b", "label": "y"}, {"text": 3, "label": "x"}],
     r"row 3: field 'text' must be a string"),
    ([{"text": "a", "tag": "x"}, {"text": "b", "tag": "y"}], r"row 1: missing field 'label'"),
])
def test_bad_rows_name_the_file_and_row(tmp_path, cfg, jsonl, rows, message):
    with pytest.raises(DataError, match=message):
        classes(cfg(jsonl(tmp_path / "rows.jsonl", rows), "classification"))


def test_text_and_label_fields_are_configurable(tmp_path, plain_tokenizer, cfg, jsonl):
    rows = [{"review": row["text"], "topic": row["label"]} for row in ROWS]
    data = cfg(jsonl(tmp_path / "rows.jsonl", rows), "classification", text_field="review",
               label_field="topic")
    splits = build_datasets(data, plain_tokenizer, labels=classes(data))
    assert torch.equal(splits.train[1]["labels"], torch.tensor(0))
