"""Accuracy and macro-F1 from a confusion matrix, against counts done by hand."""

from __future__ import annotations

import pytest
import torch

from memfit.training.class_metrics import accuracy, confusion, macro_f1


def test_metrics_of_a_small_split_match_hand_counts():
    # 4 classes; class 3 never occurs nor is predicted, class 2 is predicted but never true.
    labels = torch.tensor([0, 0, 0, 1, 1, 0])
    predicted = torch.tensor([0, 0, 1, 1, 2, 0])
    logits = torch.nn.functional.one_hot(predicted, 4).float()
    counts = confusion(labels, logits)
    assert counts.tolist() == [[3, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert accuracy(counts) == pytest.approx(4 / 6)
    # F1: class 0 2*3/(4+3) = 6/7, class 1 2*1/(2+2) = 1/2, class 2 0; class 3 left out.
    assert macro_f1(counts) == pytest.approx((6 / 7 + 1 / 2 + 0) / 3)


def test_sums_of_batches_give_the_whole_splits_metrics():
    labels, logits = torch.tensor([2, 0, 1, 1, 2]), torch.randn(5, 3)
    whole = confusion(labels, logits)
    parts = confusion(labels[:2], logits[:2]) + confusion(labels[2:], logits[2:])
    assert torch.equal(whole, parts)
    assert accuracy(whole) == pytest.approx(float((logits.argmax(-1) == labels).float().mean()))
