"""collate pads token examples on the right; count_loss_tokens counts shifted labels."""

from __future__ import annotations

import pytest
import torch

from memfit.data import IGNORE_INDEX, collate, count_loss_tokens


def example(ids: list[int], labels: list[int]) -> dict[str, torch.Tensor]:
    tensor = torch.tensor(ids)
    return {
        "input_ids": tensor,
        "attention_mask": torch.ones_like(tensor),
        "labels": torch.tensor(labels),
    }


def test_pads_to_the_longest_on_the_right():
    batch = collate([example([5, 6, 7], [-100, 6, 7]), example([8], [8])], pad_token_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert count_loss_tokens(batch) == 2  # position 0 is never predicted after the shift


def test_count_matches_the_tokens_a_shifted_loss_averages_over():
    batch = collate(
        [example([1, 2, 3, 4], [-100, -100, 3, 4]), example([1, 2], [1, 2])], pad_token_id=0
    )
    logits = torch.randn(2, 4, 9)
    loss_sum = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, 9), batch["labels"][:, 1:].reshape(-1), reduction="sum"
    )
    loss_mean = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, 9), batch["labels"][:, 1:].reshape(-1), ignore_index=IGNORE_INDEX
    )
    torch.testing.assert_close(loss_sum / count_loss_tokens(batch), loss_mean)


def test_padding_without_a_pad_token_is_refused():
    with pytest.raises(ValueError, match="pad_token_id=None"):
        collate([example([1, 2], [1, 2]), example([1], [1])])
    same_length = collate([example([1, 2], [1, 2]), example([3, 4], [3, 4])])
    assert same_length["input_ids"].shape == (2, 2)


def test_one_label_per_example_is_stacked_while_tokens_are_padded():
    short, long = torch.tensor([5, 6]), torch.tensor([7, 8, 9])
    batch = collate([{"input_ids": ids, "attention_mask": torch.ones_like(ids),
                      "labels": torch.tensor(label)} for ids, label in ((short, 1), (long, 0))],
                    pad_token_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 0], [7, 8, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch["labels"].tolist() == [1, 0]
