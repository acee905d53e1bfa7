"""``build_datasets``: a data config and a tokenizer -> train and eval datasets.

The order is fixed: read the rows, split them into train and eval by a seeded shuffle
(or, with ``data.eval_path``, train on every row of ``data.path`` and evaluate on every
row of ``data.eval_path``), then tokenize and truncate or pack each split on its own, so
no document straddles the two splits.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import torch

from memfit._utils.errors import DataError
from memfit.data import chat, classification, image_classes, instruction, text
from memfit.data.image_classes import Labelled, list_labelled
from memfit.data.images import ImageSettings, check_settings, read_images, transformed
from memfit.data.read import Row, RowSource, data_files, holds_tensors, iter_rows, read_rows
from memfit.data.tensors import TensorDictDataset, check_same_shapes, read_tensors
from memfit.data.tokens import Encoded, Packing, to_examples, warn_or_raise_on_dropped

FORMATS = ("text", "instruction", "chat", "tensors", "images", "classification")


class DataSettings(Protocol):
    """The fields of ``memfit.config.schema.DataConfig`` that this package reads.

    Properties, so that a frozen dataclass (read-only fields) satisfies the protocol.
    """

    @property
    def path(self) -> str | os.PathLike[str] | None: ...
    @property
    def format(self) -> str | Enum: ...
    @property
    def max_length(self) -> int: ...
    @property
    def eval_fraction(self) -> float: ...
    @property
    def eval_path(self) -> str | os.PathLike[str] | None: ...
    @property
    def pack(self) -> bool | None: ...
    @property
    def text_field(self) -> str: ...
    @property
    def label_field(self) -> str: ...
    @property
    def images(self) -> ImageSettings: ...


@dataclass(frozen=True)
class Splits:
    """Map-style datasets (``len()``, ``[i] -> dict[str, Tensor]``); eval may be empty."""

    train: torch.utils.data.Dataset
    eval: torch.utils.data.Dataset


@dataclass(frozen=True)
class RowSelection:
    """Some rows of some row files: global indices over ``sources``, ascending."""

    sources: list[RowSource]
    indices: list[int]

    def batches(self) -> Iterator[list[Row]]:
        return iter_rows(self.sources, self.indices)


def build_datasets(data_cfg: DataSettings, tokenizer: Any, seed: int = 0,
                   labels: Sequence[str] = ()) -> Splits:
    """Read ``data_cfg.path`` in ``data_cfg.format`` and split it into train and eval.

    ``tokenizer`` is a ``transformers`` tokenizer; it may be None for "tensors" and "images".
    ``labels``: format "classification", the class names in id order (``classes``); with
    format "images", they make it class-labelled images (data/image_classes.py), which
    also have a ``labels`` tensor of class ids.
    Raises DataError for a missing/empty/unreadable file, an unknown format or extension,
    a row without the fields its format needs, or no example left to train on.
    """
    name = format_name(data_cfg.format)
    if data_cfg.max_length < 1:
        raise DataError(f"data.max_length must be at least 1, got {data_cfg.max_length}")
    if data_cfg.path is None:
        raise DataError(f"data.path is not set; give a data file or folder for format '{name}'")
    if name == "images" and labels:
        return _image_class_splits(data_cfg, seed, labels)
    if name == "images":
        return _image_splits(data_cfg, seed)
    if name == "tensors":
        return _tensor_splits(data_cfg, seed)
    if tokenizer is None:
        raise DataError(
            f"data.format '{name}' needs a tokenizer and none was given; "
            "a model without one can only train on data.format 'tensors' or 'images'"
        )
    train, held_out = row_splits(data_cfg, seed)
    if name == "classification":
        if not labels:
            raise ValueError("format classification needs the class names (labels=...)")
        encode = functools.partial(
            classification.encode, tokenizer=tokenizer, text_field=data_cfg.text_field,
            label_field=data_cfg.label_field, names=labels, max_length=data_cfg.max_length)
        return Splits(encode(train.batches()), encode(held_out.batches()))
    encode = _encoder(name, tokenizer, data_cfg.text_field)
    packing = packing_of(data_cfg)
    train_set, train_rows, train_dropped = to_examples(
        (encode(rows) for rows in train.batches()), data_cfg.max_length, packing
    )
    eval_set, eval_rows, eval_dropped = to_examples(
        (encode(rows) for rows in held_out.batches()), data_cfg.max_length, packing
    )
    warn_or_raise_on_dropped(
        train_dropped + eval_dropped, train_rows + eval_rows, len(train_set), data_cfg.max_length
    )
    return Splits(train_set, eval_set)


def packing_of(data_cfg: DataSettings) -> Packing:
    """How a token format's rows become examples: data.pack, unset meaning the format's
    default (text packs; instruction and chat rows are padded, one per example)."""
    name = format_name(data_cfg.format)
    if name not in ("text", "instruction", "chat"):
        return "none"
    pack = data_cfg.pack if data_cfg.pack is not None else name == "text"
    if not pack:
        return "none"
    return "stream" if name == "text" else "rows"


def classes(data_cfg: DataSettings, seed: int = 0, labels: Sequence[str] = (),
            num_labels: int | None = None) -> tuple[str, ...]:
    """Format "classification" (or "images" of class folders), before any model is built:
    the class names of the rows ``build_datasets`` trains on (``classification.class_names``
    with model.labels and model.num_labels), every row of both splits checked to hold a
    text (an image file) and one of them."""
    if data_cfg.path is None:
        raise DataError("data.path is not set; give a data file or folder for format "
                        f"'{format_name(data_cfg.format)}'")
    if format_name(data_cfg.format) == "images":
        return _image_classes(data_cfg, seed, labels, num_labels)
    train, held_out = row_splits(data_cfg, seed)
    found = classification.found_labels(train.batches(), data_cfg.label_field)
    names = classification.class_names(found, labels, num_labels)
    for selection in (train, held_out):
        classification.check_rows(selection.batches(), data_cfg.text_field,
                                  data_cfg.label_field, names)
    return names


def row_splits(data_cfg: DataSettings, seed: int) -> tuple[RowSelection, RowSelection]:
    """The training and the eval rows: a seeded split of data.path by
    data.eval_fraction, or all of data.path and all of data.eval_path."""
    sources = read_rows(_files(data_cfg, "data.path"), txt_field=data_cfg.text_field)
    count = sum(len(source.table) for source in sources)
    if data_cfg.eval_path is None:
        train, held_out = split_indices(count, data_cfg.eval_fraction, seed)
        return RowSelection(sources, train), RowSelection(sources, held_out)
    eval_sources = read_rows(_files(data_cfg, "data.eval_path"), txt_field=data_cfg.text_field)
    eval_count = sum(len(source.table) for source in eval_sources)
    return (RowSelection(sources, list(range(count))),
            RowSelection(eval_sources, list(range(eval_count))))


def _files(data_cfg: DataSettings, key: str) -> list[str]:
    """The data files ``key`` (data.path or data.eval_path) names, of the format's kind."""
    name = format_name(data_cfg.format)
    path = data_cfg.path if key == "data.path" else data_cfg.eval_path
    files = data_files(str(path), key)
    tensor_files = holds_tensors(files)
    if (name == "tensors") != tensor_files:
        raise DataError(
            f"{key} {path} holds {'tensors' if tensor_files else 'rows'} but "
            f"data.format is '{name}'; .npz/.pt files go with format 'tensors', "
            "row files (.jsonl/.json/.csv/.parquet/.txt, save_to_disk folders) with the others"
        )
    return files


def _tensor_splits(data_cfg: DataSettings, seed: int) -> Splits:
    tensors = read_tensors(_files(data_cfg, "data.path"))
    if data_cfg.eval_path is None:
        return _split_tensors(tensors, data_cfg.eval_fraction, seed)
    held_out = read_tensors(_files(data_cfg, "data.eval_path"))
    check_same_shapes(tensors, held_out, f"data.path {data_cfg.path}",
                      f"data.eval_path {data_cfg.eval_path}")
    return _whole(tensors, held_out)


def _image_splits(data_cfg: DataSettings, seed: int) -> Splits:
    images = read_images(str(data_cfg.path), data_cfg.images, seed)
    if data_cfg.eval_path is None:
        return _split_tensors(images, data_cfg.eval_fraction, seed)
    held_out = read_images(str(data_cfg.eval_path), data_cfg.images, seed, "data.eval_path")
    check_same_shapes(images, held_out, f"data.path {data_cfg.path}",
                      f"data.eval_path {data_cfg.eval_path}")
    return _whole(images, held_out)


def _labelled_splits(data_cfg: DataSettings, seed: int) -> list[tuple[Labelled, list[int]]]:
    """[(train listing, its training indices), (eval listing, its eval indices)]."""
    train = list_labelled(str(data_cfg.path))
    if data_cfg.eval_path is None:
        train_indices, held_out = split_indices(len(train.labels), data_cfg.eval_fraction, seed)
        return [(train, train_indices), (train, held_out)]
    held = list_labelled(str(data_cfg.eval_path), "data.eval_path")
    return [(train, list(range(len(train.labels)))), (held, list(range(len(held.labels))))]


def _image_classes(data_cfg: DataSettings, seed: int, labels: Sequence[str],
                   num_labels: int | None) -> tuple[str, ...]:
    parts = _labelled_splits(data_cfg, seed)
    names = classification.class_names(image_classes.found_labels(*parts[0]), labels,
                                       num_labels)
    for labelled, indices in parts:
        image_classes.class_ids(labelled, indices, names)
    return names


def _image_class_splits(data_cfg: DataSettings, seed: int, labels: Sequence[str]) -> Splits:
    """Class-labelled images: ``images`` as format images makes them, ``labels`` ids."""
    check_settings(data_cfg.images, targets=False)
    (train, train_indices), (held, held_indices) = _labelled_splits(data_cfg, seed)
    tensors = _labelled_tensors(train, data_cfg.images, seed, labels)
    held_tensors = tensors
    if held is not train:
        held_tensors = _labelled_tensors(held, data_cfg.images, seed, labels)
        check_same_shapes(tensors, held_tensors, f"data.path {data_cfg.path}",
                          f"data.eval_path {data_cfg.eval_path}")
    return Splits(TensorDictDataset(tensors, torch.tensor(train_indices, dtype=torch.long)),
                  TensorDictDataset(held_tensors, torch.tensor(held_indices, dtype=torch.long)))


def _labelled_tensors(labelled: Labelled, settings: ImageSettings, seed: int,
                      labels: Sequence[str]) -> dict[str, torch.Tensor]:
    every = range(len(labelled.labels))
    return {**transformed(image_classes.read(labelled, settings), settings, seed, targets=False),
            "labels": image_classes.class_ids(labelled, every, labels)}


def _whole(train: dict[str, torch.Tensor], held_out: dict[str, torch.Tensor]) -> Splits:
    """Every example of ``train`` to train on, every one of ``held_out`` to evaluate."""
    def everything(tensors: dict[str, torch.Tensor]) -> TensorDictDataset:
        return TensorDictDataset(tensors, torch.arange(len(next(iter(tensors.values())))))

    return Splits(everything(train), everything(held_out))


def _split_tensors(tensors: dict[str, torch.Tensor], eval_fraction: float, seed: int) -> Splits:
    """Named arrays of N examples each -> train and eval views of them (no copies)."""
    train, held_out = split_indices(len(next(iter(tensors.values()))), eval_fraction, seed)
    return Splits(
        TensorDictDataset(tensors, torch.tensor(train, dtype=torch.long)),
        TensorDictDataset(tensors, torch.tensor(held_out, dtype=torch.long)),
    )


def format_name(value: str | Enum) -> str:
    """The format as its plain string, from a string or the config's str Enum."""
    name = str(value.value if isinstance(value, Enum) else value)
    if name not in FORMATS:
        raise DataError(f"data.format '{name}' is unknown; choose one of {', '.join(FORMATS)}")
    return name


def split_indices(count: int, eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Row indices for train and eval, each ascending; eval is a seeded random sample.

    The eval size is ``round(count * eval_fraction)``, at least 1 when the fraction is
    above 0, and always leaves at least one row to train on.
    """
    if not 0 <= eval_fraction < 1:
        raise DataError(f"data.eval_fraction must be in [0, 1), got {eval_fraction}")
    if eval_fraction == 0:
        return list(range(count)), []
    if count < 2:
        raise DataError(
            f"data.eval_fraction={eval_fraction} needs at least 2 rows (documents) to split, "
            f"found {count}; set data.eval_fraction=0 or add rows"
        )
    eval_count = min(max(round(count * eval_fraction), 1), count - 1)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    held_out = sorted(order[:eval_count].tolist())
    train = sorted(order[eval_count:].tolist())
    return train, held_out


def _encoder(
    name: str, tokenizer: Any, text_field: str
) -> Callable[[Sequence[Row]], list[Encoded]]:
    if name == "text":
        return functools.partial(text.encode, tokenizer=tokenizer, text_field=text_field)
    if name == "instruction":
        return functools.partial(instruction.encode, tokenizer=tokenizer)
    return functools.partial(chat.encode, tokenizer=tokenizer)
