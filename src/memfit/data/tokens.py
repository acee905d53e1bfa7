"""Token sequences shared by the text, instruction and chat formats.

Every token format turns a row into ``Encoded``: ``input_ids`` and ``labels`` of equal
length, labels NOT shifted (the model's loss shifts them) and ``IGNORE_INDEX`` where a
token is context rather than something to learn. This file cuts those into examples
(truncate; or pack: text as one stream, whole rows with packing.py) and drops the ones
with nothing left to learn.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from memfit._utils.errors import DataError, MemfitWarning
from memfit.data.packing import first_fit

# The label value that torch's cross_entropy (and every HF causal-LM loss) skips.
IGNORE_INDEX = -100


@dataclass(frozen=True)
class Encoded:
    """One row as tokens; ``labels[i]`` is ``input_ids[i]`` or IGNORE_INDEX."""

    input_ids: list[int]
    labels: list[int]


# How rows become examples: one per row (truncated), "stream" (text: documents joined and
# cut into blocks), "rows" (instruction, chat: whole rows first-fit into blocks, packing.py).
Packing = Literal["none", "stream", "rows"]


class TokenDataset(torch.utils.data.Dataset):
    """Examples of 1-D int64 ``input_ids`` / ``attention_mask`` / ``labels`` (equal lengths),
    and ``position_ids`` (each row's own positions) when rows were packed into blocks."""

    def __init__(self, input_ids: list[torch.Tensor], labels: list[torch.Tensor],
                 position_ids: list[torch.Tensor] | None = None) -> None:
        self.input_ids = input_ids
        self.labels = labels
        self.position_ids = position_ids

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.input_ids[i]
        example = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                   "labels": self.labels[i]}
        if self.position_ids is not None:
            example["position_ids"] = self.position_ids[i]
        return example


def bos_ids(tokenizer: Any) -> list[int]:
    """[bos] when the tokenizer has a bos distinct from eos, else [].

    GPT-2 style tokenizers reuse eos as bos; prepending it too would put two eos tokens
    between packed documents.
    """
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    return [bos] if bos is not None and bos != eos else []


def eos_ids(tokenizer: Any) -> list[int]:
    """[eos] when the tokenizer has one, else []."""
    return [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]


def tokenize(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without the tokenizer adding bos/eos (the formats place them)."""
    if not texts:
        return []
    encoded = tokenizer(
        list(texts),
        add_special_tokens=False,
        return_attention_mask=False,
        return_token_type_ids=False,
    )
    return encoded["input_ids"]


def require_string(row_values: dict[str, Any], field: str, where: str, needs: str) -> str:
    """The string in ``field``; DataError naming the row when it is missing or not a string.

    ``needs`` describes the fields the format needs, for the message.
    """
    value = row_values.get(field)
    if value is None:
        raise DataError(f"{where}: missing field '{field}'; this format needs {needs}")
    if not isinstance(value, str):
        raise DataError(
            f"{where}: field '{field}' must be a string, got {type(value).__name__} {value!r:.60}"
        )
    return value


def to_examples(
    batches: Iterable[Sequence[Encoded]], max_length: int, packing: Packing
) -> tuple[TokenDataset, int, int]:
    """Cut encoded rows into examples of at most ``max_length`` tokens.

    "none": one example per row, truncated; rows with no label left are dropped.
    "stream": rows joined end to end and cut into blocks of ``max_length`` (all but the
    last exactly that long, no token lost); blocks are views of one flat tensor.
    "rows": rows truncated and dropped as for "none", then packed whole into blocks of at
    most ``max_length`` tokens, each row seeing only itself (packing.py).
    Returns the dataset, the number of rows read and the number dropped.
    """
    stream = packing == "stream"
    input_ids: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    total = 0
    for batch in batches:
        total += len(batch)
        for row in batch:
            # A stream keeps whole rows here and cuts the joined stream below.
            row_labels = row.labels if stream else row.labels[:max_length]
            if row_labels.count(IGNORE_INDEX) == len(row_labels):
                continue
            input_ids.append(torch.tensor(row.input_ids[: len(row_labels)], dtype=torch.long))
            labels.append(torch.tensor(row_labels, dtype=torch.long))
    dropped = total - len(input_ids)
    if stream and input_ids:
        input_ids = list(torch.cat(input_ids).split(max_length))
        labels = list(torch.cat(labels).split(max_length))
    if packing == "rows":
        return pack_rows(input_ids, labels, max_length), total, dropped
    return TokenDataset(input_ids, labels), total, dropped


def pack_rows(input_ids: list[torch.Tensor], labels: list[torch.Tensor],
              max_length: int) -> TokenDataset:
    """Rows (1-D, at most ``max_length`` tokens each) first-fit into blocks of at most
    ``max_length`` tokens (packing.py), every row kept apart from the others in its block:

    - ``position_ids`` restart at 0 with each row. transformers reads the restarts as
      sequence boundaries (``masking_utils.find_packed_sequence_indices``): a
      block-diagonal causal mask under sdpa and eager, varlen kernels under flash
      attention (models/packed.py);
    - the first label of each row is IGNORE_INDEX: the token before it is another row's,
      so nothing is predicted across a boundary, and the loss counts exactly the tokens an
      unpacked, padded batch of the same rows counts.
    """
    blocks: list[list[int]] = first_fit([len(ids) for ids in input_ids], max_length)
    packed_ids, packed_labels, positions = [], [], []
    for rows in blocks:
        row_labels = [labels[row].clone() for row in rows]
        for first in row_labels:
            first[0] = IGNORE_INDEX
        packed_ids.append(torch.cat([input_ids[row] for row in rows]))
        packed_labels.append(torch.cat(row_labels))
        positions.append(torch.cat([torch.arange(len(input_ids[row])) for row in rows]))
    return TokenDataset(packed_ids, packed_labels, positions)


def warn_or_raise_on_dropped(
    dropped: int, total: int, kept_for_training: int, max_length: int
) -> None:
    """Say that rows with no token in the loss were dropped; fail when none is left to train on."""
    why = (
        f"no token in the loss within data.max_length={max_length} (a prompt that fills "
        "max_length, or a chat with no assistant reply)"
    )
    if kept_for_training == 0:
        raise DataError(
            f"no training example is left: {dropped} of {total} rows have {why}; "
            "raise data.max_length or shorten the prompts"
        )
    if dropped:
        warnings.warn(f"dropped {dropped} of {total} rows with {why}", MemfitWarning,
                      stacklevel=3)
