"""The planner sizes token batches from the rows the run will draw: the longest padded
micro-batch (instruction rows padded to the longest in each batch), or data.max_length for
packed blocks, and lands within 15% of the tracker's exact bytes for both."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from accuracy_cases import measure_peak_bytes

from memfit.data import build_datasets
from memfit.models.load import load_tokenizer
from memfit.plan import estimate
from memfit.plan.trace_inputs import TokenShape, token_shape
from memfit.techniques.config_checks import from_mapping
from memfit.training.batches import BatchStream

MAX_LENGTH = 256
STEPS = 2


def write_rows(path: Path) -> Path:
    """Short rows, and a few long ones the first steps may or may not draw."""
    with path.open("w") as handle:
        for index in range(40):
            words = 3 + (index * 7) % 11 + (20 if index % 13 == 5 else 0)
            handle.write(json.dumps({"prompt": f"row {index}: say " + "ha " * (words // 3),
                                     "response": "yes " * words}) + "\n")
    return path


def config(rows: Path, *, pack: bool | None = None):
    data = {"path": str(rows), "format": "instruction", "max_length": MAX_LENGTH,
            "eval_fraction": 0.0}
    if pack is not None:
        data["pack"] = pack
    return from_mapping({"model": {"preset": "tiny-llama"}, "data": data,
                         "adapter": {"kind": "lora", "rank": 4},
                         "train": {"micro_batch_size": 4, "gradient_accumulation_steps": 1,
                                   "max_steps": STEPS, "eval_every": 0}})


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    return write_rows(tmp_path_factory.mktemp("rows") / "rows.jsonl")


def test_the_length_is_the_longest_micro_batch_the_run_draws(rows):
    """Oracle: the batch stream itself, collating the run's micro-batches."""
    padded = config(rows)
    splits = build_datasets(padded.data, load_tokenizer(padded.model), seed=padded.train.seed)
    stream = BatchStream(splits.train, 4, padded.train.seed, lambda examples: examples)
    longest = max(len(example["input_ids"]) for _ in range(STEPS)
                  for example in stream.next_batch())
    longest_row = max(len(example["input_ids"]) for example in splits.train)
    assert token_shape(padded) == TokenShape(longest, "none")
    assert longest < longest_row < MAX_LENGTH  # the run never draws its longest row
    # A whole pass sees every row; packed blocks are planned at data.max_length.
    epoch = replace(padded, train=replace(padded.train, max_steps=None, epochs=1.0))
    assert token_shape(epoch).length == longest_row
    assert token_shape(config(rows, pack=True)) == TokenShape(MAX_LENGTH, "rows")


@pytest.mark.parametrize("pack", [False, True], ids=["padded", "packed"])
def test_planned_within_15_percent_of_measured(rows, pack):
    run = config(rows, pack=pack)
    planned = estimate(run, device="cpu").peak_tensor_bytes
    measured = measure_peak_bytes(run, steps=STEPS)
    assert 0 <= planned / measured - 1 <= 0.15, (planned, measured)
