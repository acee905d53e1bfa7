"""Format "tensors" with token arrays and one label per example (#16 item 2): the labels
are stacked, not padded like the tokens, and arrays whose shapes cannot batch together
are refused when the data is read, before a model is built or a run folder written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from cli_helpers import assert_one_line_error, run_in_process, tree_digest

# forward(**batch) returns the mean loss (the factory convention) of a mean-pooled
# bag-of-tokens classifier: labels are (batch,) class ids.
CLASSIFIER = '''
import torch
import torch.nn.functional as F
from torch import nn


class MeanPoolClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.out = nn.Linear(16, 3)

    def forward(self, input_ids, attention_mask, labels):
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1)
        return F.cross_entropy(self.out(pooled), labels)


def classifier():
    return MeanPoolClassifier()
'''


def write_tokens(path: Path, examples: int = 32, tokens: int = 12,
                 mask_tokens: int | None = None) -> Path:
    """input_ids (examples, tokens), attention_mask (examples, mask_tokens or tokens) with
    the last positions of some rows masked, labels (examples,)."""
    generator = np.random.default_rng(0)
    lengths = generator.integers(4, tokens + 1, size=examples)
    mask = (np.arange(mask_tokens or tokens)[None, :] < lengths[:, None]).astype(np.int64)
    np.savez(path, input_ids=generator.integers(1, 50, size=(examples, tokens)),
             attention_mask=mask, labels=generator.integers(0, 3, size=examples))
    return path


def train(tmp_path: Path, data: Path):
    (tmp_path / "classifier.py").write_text(CLASSIFIER)
    return run_in_process(
        "train", "model.preset=null", f"model.factory={tmp_path / 'classifier.py'}:classifier",
        "model.task=custom", f"data.path={data}", "data.format=tensors",
        "data.eval_fraction=0.25", "train.max_steps=2", "train.micro_batch_size=4",
        "log.tensorboard=false", "log.progress=false", f"train.output_dir={tmp_path / 'run'}",
        cwd=tmp_path)


def test_one_label_per_example_is_stacked_beside_padded_tokens(tmp_path: Path):
    result = train(tmp_path, write_tokens(tmp_path / "tokens.npz"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "summary.json").is_file()


def test_a_mask_of_another_length_is_one_line_before_anything_is_built(tmp_path: Path):
    data = write_tokens(tmp_path / "tokens.npz", mask_tokens=10)
    (tmp_path / "classifier.py").write_text(CLASSIFIER)
    before = tree_digest(tmp_path)
    result = train(tmp_path, data)
    assert_one_line_error(result, 2, "tokens.npz", "attention_mask has shape (32, 10)",
                          "input_ids (32, 12)")
    assert tree_digest(tmp_path) == before
