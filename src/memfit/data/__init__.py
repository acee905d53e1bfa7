"""Data: local files -> tokenized, split, packed examples -> padded batches.

``build_datasets(data_cfg, tokenizer, seed)`` reads ``data_cfg.path`` in one of the formats
"text", "instruction", "chat", "classification", "tensors" or "images" and returns
``Splits(train, eval)``; ``classes`` gives the classes of "classification" data (and
checks its rows) before a model is built; ``collate`` pads a list of examples into a batch;
``count_loss_tokens`` counts what a causal-LM loss will average over, ``count_positions``
the tokens and padding of a batch. See each format's
module for its template.
"""

from memfit.data.build import FORMATS, Splits, build_datasets, classes
from memfit.data.collate import collate, count_loss_tokens, count_positions
from memfit.data.tokens import IGNORE_INDEX

__all__ = ["FORMATS", "IGNORE_INDEX", "Splits", "build_datasets", "classes", "collate",
           "count_loss_tokens", "count_positions"]
