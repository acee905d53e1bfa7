"""What model.task=sequence-classification and image-classification add to a model: its
classes (``with_classes``: from the training data and model.labels / model.num_labels, in
a Hugging Face model's config so every export carries ``id2label`` / ``label2id``), and
the new head that trains in full beside adapters.

The head is found as PEFT finds it for ``task_type=SEQ_CLS``: the model's top-level
parts named ``classifier`` (BERT, RoBERTa, DistilBERT, whose ``pre_classifier`` is new
too; ViT, ResNet, ConvNeXt; the conv-classifier preset) or ``score`` (Llama, Qwen, GPT-2
and other decoder classifiers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from torch import nn

from memfit.config.choices import CLASSIFYING_TASKS
from memfit.config.schema import Config, DataConfig, ModelConfig
from memfit.data import classes

HEAD_SUFFIXES = ("classifier", "score")


def with_classes(config: Config) -> Config:
    """``config`` with model.labels and model.num_labels as the training data and those
    keys decide them (data.classes, which checks every row); configs of other tasks are
    returned as they are. Training, and planning with data, build the head from these."""
    if config.model.task not in CLASSIFYING_TASKS:
        return config
    return replace(config, model=classified(config.model, config.data, config.train.seed))


def classified(model: ModelConfig, data: DataConfig, seed: int) -> ModelConfig:
    """A classifier's ``model`` section with the classes of the rows it trains on
    (``with_classes``); ``seed``: train.seed, which splits off the eval rows."""
    names = classes(data, seed, model.labels, model.num_labels)
    return replace(model, labels=names, num_labels=len(names))


def label_arguments(labels: Sequence[str]) -> dict[str, Any]:
    """transformers config fields for a classifier of ``labels`` (names in id order)."""
    return {"num_labels": len(labels),
            "id2label": dict(enumerate(labels)),
            "label2id": {name: index for index, name in enumerate(labels)},
            # One class per example, trained with cross-entropy: what the head was trained
            # for, so transformers' own loss (labels=...) computes the same one.
            "problem_type": "single_label_classification"}


def class_labels(model: ModelConfig) -> tuple[str, ...]:
    """model.labels where the task reads them (what the data is labelled with), else ()."""
    return model.labels if model.task in CLASSIFYING_TASKS else ()


def head_names(model: nn.Module) -> list[str]:
    """The top-level parts of a classifier that make up its new head."""
    return [name for name, _ in model.named_children() if name.endswith(HEAD_SUFFIXES)]
