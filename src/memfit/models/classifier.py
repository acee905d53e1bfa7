"""What model.task=sequence-classification adds to a Hugging Face model: its classes
(``with_classes``: from the training data and model.labels / model.num_labels, in the
transformers config so every export carries ``id2label`` / ``label2id``), and the new
head that trains in full beside adapters.

The head is found as PEFT finds it for ``task_type=SEQ_CLS``: the model's top-level
parts named ``classifier`` (BERT, RoBERTa, DistilBERT, whose ``pre_classifier`` is new
too) or ``score`` (Llama, Qwen, GPT-2 and other decoder classifiers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from torch import nn

from memfit.config.schema import Config, Task
from memfit.data import classes

HEAD_SUFFIXES = ("classifier", "score")


def with_classes(config: Config) -> Config:
    """``config`` with model.labels and model.num_labels as the training data and those
    keys decide them (data.classes, which checks every row); configs of other tasks are
    returned as they are. Training, and planning with data, build the head from these."""
    if config.model.task is not Task.SEQUENCE_CLASSIFICATION:
        return config
    names = classes(config.data, config.train.seed, config.model.labels,
                    config.model.num_labels)
    return replace(config, model=replace(config.model, labels=names, num_labels=len(names)))


def label_arguments(labels: Sequence[str]) -> dict[str, Any]:
    """transformers config fields for a classifier of ``labels`` (names in id order)."""
    return {"num_labels": len(labels),
            "id2label": dict(enumerate(labels)),
            "label2id": {name: index for index, name in enumerate(labels)},
            # One class per example, trained with cross-entropy: what the head was trained
            # for, so transformers' own loss (labels=...) computes the same one.
            "problem_type": "single_label_classification"}


def head_names(model: nn.Module) -> list[str]:
    """The top-level parts of a sequence classifier that make up its new head."""
    return [name for name, _ in model.named_children() if name.endswith(HEAD_SUFFIXES)]
