"""Examples -> one batch: right-pad token formats, stack everything else."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from memfit.data.tokens import IGNORE_INDEX


def collate(
    examples: Sequence[dict[str, torch.Tensor]], pad_token_id: int | None = None
) -> dict[str, torch.Tensor]:
    """Stack examples into a batch, each field of shape (batch, ...).

    Token examples (those with ``input_ids``) are padded on the right to the longest in
    the batch: input_ids with ``pad_token_id``, attention_mask with 0, labels with -100,
    giving (batch, longest) tensors. Other fields, and all fields of "tensors" examples,
    are stacked as they are. ``pad_token_id`` may be None only when no padding is needed.
    """
    if not examples:
        raise ValueError("collate needs at least one example")
    if "input_ids" not in examples[0]:
        return {name: torch.stack([example[name] for example in examples]) for name in examples[0]}
    longest = max(len(example["input_ids"]) for example in examples)
    if pad_token_id is None and any(len(example["input_ids"]) < longest for example in examples):
        raise ValueError(
            "collate got examples of different lengths and pad_token_id=None; set the "
            "tokenizer's pad token (e.g. tokenizer.pad_token = tokenizer.eos_token)"
        )
    # Padding is neither attended to (mask 0) nor learned (label -100).
    pad_values = {"input_ids": pad_token_id, "attention_mask": 0, "labels": IGNORE_INDEX}
    batch = {}
    for name in examples[0]:
        values = [example[name] for example in examples]
        if name in pad_values:
            values = [
                torch.nn.functional.pad(value, (0, longest - len(value)), value=pad_values[name])
                for value in values
            ]
        batch[name] = torch.stack(values)
    return batch


def count_loss_tokens(batch: dict[str, torch.Tensor]) -> int:
    """How many label positions a causal-LM loss counts: labels shifted by one, not -100.

    The training loop divides the summed loss by this total over all micro-batches of a
    step, so every token weighs the same whatever batch it landed in.
    """
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
