"""Classification quality over a whole eval split, from its confusion matrix.

``confusion[t, p]`` counts the examples of true class t predicted as p (argmax of the
logits), summed over every eval batch, so both metrics are exact over the split rather
than means of per-batch values:

- accuracy: correct predictions / examples;
- macro-F1: the unweighted mean over classes of F1 = 2 TP / (2 TP + FP + FN), over the
  classes that occur in the eval split or are predicted (scikit-learn's
  ``f1_score(average="macro")`` default): a class that is neither contributes nothing.
"""

from __future__ import annotations

import torch


def confusion(labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """(classes, classes) int64 counts from (B,) class ids and (B, classes) logits."""
    classes = logits.shape[-1]
    pairs = labels * classes + logits.argmax(-1)
    return torch.bincount(pairs, minlength=classes * classes).view(classes, classes)


def accuracy(counts: torch.Tensor) -> float:
    return float(counts.diagonal().sum() / counts.sum().clamp(min=1))


def macro_f1(counts: torch.Tensor) -> float:
    true_positives = counts.diagonal().double()
    actual, predicted = counts.sum(1).double(), counts.sum(0).double()
    seen = (actual + predicted) > 0
    # 2 TP + FP + FN = (TP + FN) + (TP + FP): actual plus predicted examples of the class.
    f1 = 2 * true_positives[seen] / (actual + predicted)[seen]
    return float(f1.mean()) if seen.any() else 0.0
