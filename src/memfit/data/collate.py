"""Examples -> one batch: right-pad token sequences, stack everything else."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from memfit.data.tokens import IGNORE_INDEX

# What each per-token field is padded with: padding is neither attended to (mask 0) nor
# learned (label -100). Packed blocks' position ids pad with 0: every padding token starts
# a one-token sequence of its own, which no real token attends to (tokens.pack_rows).
_PAD_VALUES = {"attention_mask": 0, "labels": IGNORE_INDEX, "position_ids": 0}


def collate(
    examples: Sequence[dict[str, torch.Tensor]], pad_token_id: int | None = None
) -> dict[str, torch.Tensor]:
    """Stack examples into a batch, each field of shape (batch, ...).

    Token examples (those with ``input_ids``) are padded on the right to the longest in
    the batch: input_ids with ``pad_token_id``, and attention_mask (0), labels (-100) and
    position_ids (0) where they hold one value per token, giving (batch, longest)
    tensors. Everything else — a label per example (0-d), images, all fields of examples
    without input_ids — is stacked as it is. ``pad_token_id`` may be None only when no
    padding is needed.
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
    pad_values = {"input_ids": pad_token_id, **_PAD_VALUES}
    batch = {}
    for name in examples[0]:
        values = [example[name] for example in examples]
        if name in pad_values and all(_per_token(value, example)
                                      for value, example in zip(values, examples, strict=True)):
            values = [
                torch.nn.functional.pad(value, (0, longest - len(value)), value=pad_values[name])
                for value in values
            ]
        batch[name] = torch.stack(values)
    return batch


def _per_token(value: torch.Tensor, example: dict[str, torch.Tensor]) -> bool:
    """One value per token of the example: a 1-D tensor as long as its input_ids."""
    return value.ndim == 1 and len(value) == len(example["input_ids"])


def count_loss_tokens(batch: dict[str, torch.Tensor]) -> int:
    """How many label positions a causal-LM loss counts: labels shifted by one, not -100.

    The training loop divides the summed loss by this total over all micro-batches of a
    step, so every token weighs the same whatever batch it landed in.
    """
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def count_positions(batch: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(tokens, positions) of a token batch: the tokens it feeds the model (attention_mask
    1, prompt and learned tokens alike) and the (batch x longest) positions they fill; the
    rest is padding. (0, 0) for a batch without tokens."""
    mask = batch.get("attention_mask")
    if mask is None or "input_ids" not in batch:
        return 0, 0
    return int(mask.sum()), mask.numel()
