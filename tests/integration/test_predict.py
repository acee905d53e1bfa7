"""`memfit predict` on a LoRA run of the tiny BERT classifier: each row's label is the
argmax of the logits plain transformers + PEFT compute for that text alone."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_line_error, run_in_process, tree_digest
from tiny_bert import LABELS, review_rows, write_jsonl, write_tiny_bert

pytestmark = pytest.mark.usefixtures("quiet_transformers")


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    """base/ (the tiny BERT), a finished LoRA run in run/, and rows.jsonl to classify."""
    folder = tmp_path_factory.mktemp("predict")
    write_tiny_bert(folder / "base")
    write_jsonl(folder / "train.jsonl", review_rows(32, seed=1))
    rows = [{"text": row["text"]} for row in review_rows(11, seed=3)]  # no labels needed
    write_jsonl(folder / "rows.jsonl", rows)
    result = run_in_process(
        "train", f"model.path={folder / 'base'}", "model.preset=null",
        "model.task=sequence-classification",
        f"data.path={folder / 'train.jsonl'}", "data.format=classification",
        "data.max_length=32", "data.eval_fraction=0", "adapter.kind=lora", "adapter.rank=4",
        "optimizer.lr=2e-2", "train.max_steps=16", "train.micro_batch_size=8",
        f"train.output_dir={folder / 'run'}", "log.progress=false", "log.tensorboard=false",
        cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder


def reference(task: Path) -> tuple[list[str], list[float]]:
    """Each row's label and its probability from PEFT's adapter on the plain base."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    plain = AutoModelForSequenceClassification.from_pretrained(
        task / "base", id2label=dict(enumerate(LABELS)))
    model = PeftModel.from_pretrained(plain, task / "run" / "adapter").eval()
    tokenizer = AutoTokenizer.from_pretrained(task / "base")
    texts = [json.loads(line)["text"] for line in (task / "rows.jsonl").read_text().splitlines()]
    with torch.no_grad():
        logits = torch.cat([model(**tokenizer(text, return_tensors="pt")).logits
                            for text in texts])  # (rows, classes)
    probabilities = logits.softmax(-1)
    return ([LABELS[index] for index in logits.argmax(-1).tolist()],
            probabilities.max(-1).values.tolist())


def test_each_row_gets_the_argmax_label_of_the_models_logits(task: Path):
    result = run_in_process("predict", str(task / "run"), str(task / "rows.jsonl"), cwd=task)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    labels, probabilities = reference(task)
    assert [record["row"] for record in records] == list(range(11))
    assert [record["label"] for record in records] == labels
    assert len(set(labels)) == 2, "one class everywhere: the test could not tell argmax apart"
    torch.testing.assert_close([record["probability"] for record in records], probabilities,
                               rtol=1e-4, atol=1e-5)

    # The same rows as CSV, written to --output (and written again over its own output).
    rows_csv = task / "rows.csv"
    with rows_csv.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text"])
        writer.writerows([json.loads(line)["text"]]
                         for line in (task / "rows.jsonl").read_text().splitlines())
    out = task / "predictions.jsonl"
    for _ in range(2):
        written = run_in_process("predict", str(task / "run"), str(rows_csv), "--output",
                                 str(out), cwd=task)
        assert written.returncode == 0, written.stderr
        assert written.stdout == f"predictions   11 rows -> {out}\n"
    assert [json.loads(line) for line in out.read_text().splitlines()] == records


def test_bad_input_is_one_line_and_writes_nothing(task: Path):
    notes = task / "notes.txt"
    notes.write_text("my notes\n")
    run, rows = str(task / "run"), str(task / "rows.jsonl")
    cases = [
        (["predict", run, str(task / "absent.jsonl")], "FILE"),
        (["predict", run, rows, "--output", str(notes)], "holds no predictions"),
        (["predict", run, rows, "--output", rows], "that is FILE itself"),
        (["predict", run, rows, "--output", str(task / "run" / "p.jsonl")],
         "inside the run folder"),
        (["predict", str(task / "base"), rows], "no config.yaml there (not a run folder)"),
        (["generate", run, "--prompt", "hi"], f"use memfit predict {run} FILE"),
        (["train", "--resume", run, "data.sample_prompts=[hi]"],
         "data.sample_prompts needs model.task=causal-lm, not sequence-classification"),
    ]
    before = tree_digest(task)
    for arguments, fragment in cases:
        assert_one_line_error(run_in_process(*arguments, cwd=task), 2, fragment)
    assert tree_digest(task) == before
