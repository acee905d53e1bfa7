"""The "classification" format: a text and its class, for model.task=sequence-classification.

A row holds the text in ``data.text_field`` (default ``text``) and the label in
``data.label_field`` (default ``label``). A label is an integer, which is the class id,
or a string, which is the class name; one kind for the whole training data.

The classes come from the TRAINING rows only (``found_labels``): string labels sorted,
integer labels as the ids 0..max. ``class_names`` lets ``model.labels`` name them and
``model.num_labels`` widen them. Every label, eval rows' included, must then be one of
those classes (``check_rows``): a class the model never trained on is refused, not scored.

An example is the tokenizer's own encoding of the text, special tokens included (BERT's
``[CLS] ... [SEP]``), as ``tokenizer(text)`` gives it at inference, truncated to
``data.max_length``; ``labels`` is the class id as a 0-d int64 tensor.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from memfit._utils.errors import DataError
from memfit.config.limits import MAX_CLASSES
from memfit.data.read import Row
from memfit.data.tokens import require_string


@dataclass(frozen=True)
class FoundLabels:
    """The labels of the training rows: all integers or all strings."""

    values: tuple[int, ...] | tuple[str, ...]  # distinct, sorted
    rows: int

    @property
    def names(self) -> tuple[str, ...]:
        """The classes they imply, in id order."""
        if isinstance(self.values[0], int):
            return tuple(str(index) for index in range(max(self.values) + 1))
        return self.values

    def describe(self) -> str:
        shown = ", ".join(str(value) for value in self.values[:10])
        more = f", ... ({len(self.values)} in all)" if len(self.values) > 10 else ""
        return shown + more


def _label(row: Row, label_field: str) -> int | str:
    value = row.values.get(label_field)
    if value is None:
        raise DataError(f"{row.where}: missing field '{label_field}' (data.label_field); "
                        "format classification needs a text and a label in every row")
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise DataError(f"{row.where}: label {value!r:.60} in '{label_field}' is a "
                        f"{type(value).__name__}; a label is an integer (the class id) or a "
                        "string (the class name)")
    if value == "":
        # Refused here, at the start: a run whose classes include "" could never be
        # resumed or merged (model.labels must be non-empty names).
        raise DataError(f"{row.where}: the label in '{label_field}' is an empty string; a "
                        "class name must have at least one character")
    if isinstance(value, int) and value >= MAX_CLASSES:
        # Integer labels imply the classes 0..max: 999999999999 would make 10**12 of them.
        raise DataError(f"{row.where}: label {value} is a class id beyond memfit's limit of "
                        f"{MAX_CLASSES:,} classes (integer labels are ids 0, 1, 2, ...)")
    return value


def found_labels(batches: Iterable[Sequence[Row]], label_field: str) -> FoundLabels:
    """The distinct labels of the training rows; DataError for a missing or ill-typed
    label, a mix of integers and strings, a negative id, or fewer than two classes."""
    first: dict[type, tuple[str, int | str]] = {}  # kind -> (where, value) of its first row
    values: set[int | str] = set()
    rows = 0
    for batch in batches:
        for row in batch:
            value = _label(row, label_field)
            rows += 1
            first.setdefault(type(value), (row.where, value))
            if isinstance(value, int) and value < 0:
                raise DataError(f"{row.where}: label {value} is a negative class id; integer "
                                "labels are ids 0, 1, 2, ...")
            values.add(value)
    if len(first) > 1:
        (where_int, an_int), (where_str, a_str) = first[int], first[str]
        raise DataError(f"{where_str}: label {a_str!r} is a string but {where_int} has the "
                        f"integer {an_int}; use class names or class ids, not both")
    if len(values) > MAX_CLASSES:
        raise DataError(f"the training data has {len(values):,} distinct labels in "
                        f"'{label_field}', beyond memfit's limit of {MAX_CLASSES:,} classes")
    if len(values) < 2:
        only = f"{next(iter(values))!r} in all {rows} rows" if values else "no rows"
        raise DataError(f"the training data has one class ({only}); a classifier needs at "
                        "least 2 classes to learn")
    return FoundLabels(tuple(sorted(values)), rows)  # type: ignore[arg-type]


def class_names(found: FoundLabels, labels: Sequence[str], num_labels: int | None
                ) -> tuple[str, ...]:
    """The classes in id order: ``labels`` (model.labels) when given, which must cover
    what the training data holds; else those found, widened to ``num_labels``
    (model.num_labels) with transformers' default names LABEL_<id>."""
    if labels:
        missing = ([value for value in found.values if value not in labels]
                   if isinstance(found.values[0], str)
                   else [value for value in found.values if value >= len(labels)])
        if missing:
            raise DataError(f"the training data has label {missing[0]!r}, which is not one of "
                            f"model.labels={list(labels)} (strings are class names, integers "
                            f"ids 0..{len(labels) - 1})")
        return tuple(labels)
    names = found.names
    if num_labels is not None and num_labels < len(names):
        raise DataError(f"model.num_labels={num_labels} is fewer than the {len(names)} classes "
                        f"the training data needs ({found.describe()}); raise it or drop it")
    return names + tuple(f"LABEL_{index}" for index in range(len(names), num_labels or 0))


def class_id(row: Row, label_field: str, names: Sequence[str]) -> int:
    value = _label(row, label_field)
    if isinstance(value, int):
        if value >= len(names):
            raise DataError(f"{row.where}: label {value} is not a class id of this model "
                            f"(0..{len(names) - 1}: {', '.join(names)})")
        return value
    if value not in names:
        raise DataError(f"{row.where}: label {value!r} is not one of the classes the model "
                        f"trains on ({', '.join(names)}: the training data's labels, or "
                        "model.labels)")
    return names.index(value)


def check_rows(batches: Iterable[Sequence[Row]], text_field: str, label_field: str,
               names: Sequence[str]) -> None:
    """Every row holds a text and a label of one of ``names``: what ``encode`` needs,
    checked before a model is built, so bad rows cost no model load."""
    needs = f"'{text_field}' (data.text_field)"
    for rows in batches:
        for row in rows:
            require_string(row.values, text_field, row.where, needs)
            class_id(row, label_field, names)


class ClassificationDataset(torch.utils.data.Dataset):
    """Examples of 1-D int64 ``input_ids`` / ``attention_mask`` and a 0-d int64 ``labels``."""

    def __init__(self, input_ids: list[torch.Tensor], labels: torch.Tensor) -> None:
        self.input_ids = input_ids
        self.labels = labels  # (len,) class ids

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.input_ids[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                "labels": self.labels[i]}


def encode(batches: Iterable[Sequence[Row]], tokenizer: Any, text_field: str,
           label_field: str, names: Sequence[str], max_length: int) -> ClassificationDataset:
    """Every row as an example (none is dropped: each has its label)."""
    input_ids: list[torch.Tensor] = []
    labels: list[int] = []
    for rows in batches:
        labels += [class_id(row, label_field, names) for row in rows]
        input_ids += text_ids(rows, tokenizer, text_field, max_length)
    return ClassificationDataset(input_ids, torch.tensor(labels, dtype=torch.long))


def text_ids(rows: Sequence[Row], tokenizer: Any, text_field: str,
             max_length: int) -> list[torch.Tensor]:
    """Each row's text as the model reads it (training and ``memfit predict`` alike):
    1-D int64 ids, special tokens included, truncated to ``max_length``."""
    needs = f"'{text_field}' (data.text_field)"
    texts = [require_string(row.values, text_field, row.where, needs) for row in rows]
    if not texts:
        return []
    encoded = tokenizer(texts, truncation=True, max_length=max_length,
                        return_attention_mask=False, return_token_type_ids=False)
    found = []
    for row, ids in zip(rows, encoded["input_ids"], strict=True):
        if not ids:
            raise DataError(f"{row.where}: the text in '{text_field}' has no tokens")
        found.append(torch.tensor(ids, dtype=torch.long))
    return found
