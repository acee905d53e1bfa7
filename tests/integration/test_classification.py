"""model.task=sequence-classification end to end through the CLI, on a tiny BERT built
here: what memfit evaluated is what plain transformers and PEFT compute from its exports.

Every check of memfit's numbers is independent of memfit: the exported or merged folder
is loaded with ``AutoModelForSequenceClassification``, each eval text is predicted alone
(no padding), and accuracy and macro-F1 are counted from those predictions here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from cli_helpers import assert_one_line_error, run_in_process, tree_digest
from tiny_bert import LABELS, review_rows, write_jsonl, write_tiny_bert

pytestmark = pytest.mark.usefixtures("quiet_transformers")


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    """A folder with base/ (the tiny BERT), train.jsonl (64 rows) and eval.jsonl (16)."""
    folder = tmp_path_factory.mktemp("classify")
    write_tiny_bert(folder / "base")
    write_jsonl(folder / "train.jsonl", review_rows(64, seed=1))
    write_jsonl(folder / "eval.jsonl", review_rows(16, seed=2))
    return folder


def write_run_config(task: Path, name: str, **sections: dict) -> Path:
    config = {
        "model": {"path": str(task / "base"), "task": "sequence-classification"},
        "data": {"path": str(task / "train.jsonl"), "eval_path": str(task / "eval.jsonl"),
                 "format": "classification", "max_length": 32},
        "train": {"micro_batch_size": 8, "lr_schedule": "constant",
                  "output_dir": str(task / "runs" / name)},
        "log": {"progress": False, "tensorboard": False},
    }
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    path = task / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def train(task: Path, name: str, **sections: dict) -> tuple[Path, dict]:
    result = run_in_process("train", str(write_run_config(task, name, **sections)), cwd=task)
    assert result.returncode == 0, result.stderr
    run_dir = task / "runs" / name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (f"eval accuracy {summary['eval_accuracy']:.4f} (macro-F1 "
            f"{summary['eval_macro_f1']:.4f})") in result.stdout
    return run_dir, summary


def predict(model: torch.nn.Module, tokenizer, texts: list[str]) -> torch.Tensor:
    """(texts, classes) logits, one text at a time."""
    model.eval()
    with torch.no_grad():
        return torch.cat([model(**tokenizer(text, return_tensors="pt")).logits
                          for text in texts])


def scores(predicted: list[str], actual: list[str]) -> tuple[float, float]:
    """Accuracy, and macro-F1 over the classes that occur or are predicted."""
    accuracy = sum(p == a for p, a in zip(predicted, actual, strict=True)) / len(actual)
    f1s = []
    for name in sorted(set(predicted) | set(actual)):
        hits = sum(p == a == name for p, a in zip(predicted, actual, strict=True))
        f1s.append(2 * hits / (predicted.count(name) + actual.count(name)))
    return accuracy, sum(f1s) / len(f1s)


def eval_rows(task: Path) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in (task / "eval.jsonl").read_text().splitlines()]
    return [row["text"] for row in rows], [row["label"] for row in rows]


def assert_memfit_scored(folder: Path, task: Path, summary: dict) -> torch.Tensor:
    """Plain transformers on ``folder`` reproduces the summary's eval scores; returns its
    eval logits."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(folder)
    assert model.config.id2label == dict(enumerate(LABELS))
    texts, labels = eval_rows(task)
    logits = predict(model, AutoTokenizer.from_pretrained(folder), texts)
    predicted = [model.config.id2label[int(index)] for index in logits.argmax(-1)]
    accuracy, macro_f1 = scores(predicted, labels)
    assert summary["eval_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert summary["eval_macro_f1"] == pytest.approx(macro_f1, abs=1e-12)
    return logits


def test_full_fine_tune_exports_a_classifier_that_scores_what_memfit_evaluated(task: Path):
    run_dir, summary = train(task, "full", optimizer={"lr": 3e-3}, train={"max_steps": 30})

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluations = [record for record in metrics if "eval_loss" in record]
    assert [record["step"] for record in evaluations] == [0, 30]
    assert not any("eval_perplexity" in record for record in evaluations)
    assert evaluations[-1]["eval_accuracy"] > evaluations[0]["eval_accuracy"]  # it learned
    assert summary["examples"] == 30 * 8
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["labels"] == \
        list(LABELS)
    assert_memfit_scored(run_dir / "model", task, summary)


def test_lora_run_merges_and_loads_onto_the_plain_model_with_peft(task: Path):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    run_dir, summary = train(task, "lora", adapter={"kind": "lora", "rank": 4},
                             optimizer={"lr": 1e-2}, train={"max_steps": 20})
    adapters = (run_dir / "adapters.txt").read_text()
    assert "classifier: trained in full" in adapters

    merged = task / "merged"
    result = run_in_process("merge", str(run_dir), "--out", str(merged), cwd=task)
    assert result.returncode == 0, result.stderr
    merged_logits = assert_memfit_scored(merged, task, summary)

    # The adapter onto the plain model from model.path, given the run's classes.
    plain = AutoModelForSequenceClassification.from_pretrained(
        task / "base", id2label=dict(enumerate(LABELS)))
    with_adapter = PeftModel.from_pretrained(plain, run_dir / "adapter")
    texts, _ = eval_rows(task)
    adapter_logits = predict(with_adapter, AutoTokenizer.from_pretrained(task / "base"), texts)
    assert torch.equal(adapter_logits.argmax(-1), merged_logits.argmax(-1))
    torch.testing.assert_close(adapter_logits, merged_logits, rtol=1e-4, atol=1e-5)


def test_integer_labels_are_class_ids_and_num_labels_widens_the_head(task: Path):
    ids = {name: index for index, name in enumerate(LABELS)}
    rows = [{"text": row["text"], "label": ids[row["label"]]} for row in review_rows(16, 3)]
    write_jsonl(task / "ids.jsonl", rows)
    run_dir, summary = train(task, "ids", data={"path": str(task / "ids.jsonl"),
                                                "eval_path": None, "eval_fraction": 0.25},
                             model={"num_labels": 3}, train={"max_steps": 2})
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]
    assert (saved["num_labels"], saved["labels"]) == (3, ["0", "1", "LABEL_2"])
    config = json.loads((run_dir / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "0", "1": "1", "2": "LABEL_2"}
    assert 0 <= summary["eval_accuracy"] <= 1


def test_plan_counts_the_new_head(task: Path):
    result = run_in_process("plan", str(write_run_config(task, "plan")), "--budget", "1GiB",
                            "--device", "cpu", "--json", cwd=task)
    assert result.returncode == 0, result.stderr
    planned = json.loads(result.stdout)["config"]["bytes"]
    assert planned["weights"] > 0 and planned["activations"] > 0
    assert not (task / "runs" / "plan").exists()


@pytest.mark.parametrize("rows, eval_rows, fragments", [
    ([{"text": "great film", "label": "positive"}, {"text": "awful"}], None,
     ("train.jsonl row 2", "missing field 'label'")),
    ([{"text": "great", "label": "positive"}, {"text": "awful", "label": 0.5}], None,
     ("row 2", "label 0.5", "integer (the class id) or a string")),
    ([{"text": "great", "label": "positive"}, {"text": "fine", "label": "positive"}], None,
     ("one class ('positive' in all 2 rows)", "at least 2 classes")),
    ([{"text": "great", "label": "positive"}, {"text": "awful", "label": 0}], None,
     ("row 1", "'positive' is a string", "row 2 has the integer 0")),
    ([{"text": "great", "label": "positive"}, {"text": "awful", "label": "negative"}],
     [{"text": "fine", "label": "neutral"}],
     ("eval.jsonl row 1", "label 'neutral' is not one of the classes", "negative, positive")),
    ([{"label": "positive"}, {"text": "awful", "label": "negative"}], None,
     ("row 1", "missing field 'text'")),
], ids=["no-label", "float-label", "one-class", "mixed-kinds", "unseen-eval-label", "no-text"])
def test_bad_rows_are_one_line_and_write_nothing(task: Path, tmp_path: Path, rows, eval_rows,
                                                 fragments):
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_jsonl(tmp_path / "eval.jsonl", eval_rows or rows)
    config = write_run_config(task, "bad", data={"path": str(tmp_path / "train.jsonl"),
                                                 "eval_path": str(tmp_path / "eval.jsonl")},
                              train={"output_dir": str(tmp_path / "run")})
    before = tree_digest(tmp_path)
    result = run_in_process("train", str(config), cwd=tmp_path)
    assert_one_line_error(result, 2, *fragments)
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("overrides, fragments", [
    (["model.num_labels=1"], ("model.num_labels must be at least 2",)),
    (["data.format=text"], ("model.task=sequence-classification and data.format=classification "
                            "go together",)),
    (["model.labels=[positive, negative, positive]"], ("each once",)),
    (["model.labels=[positive]", "model.num_labels=2"], ("at least 2 classes",)),
    (["adapter.kind=lora", "adapter.targets=[classifier]"],
     ("matched only the new classification head (classifier)", "trains in full")),
    (["model.path=null", "model.preset=tiny-llama"], ("set model.path instead of model.preset",)),
])
def test_bad_keys_are_one_line_and_write_nothing(task: Path, tmp_path: Path, overrides,
                                                 fragments):
    config = write_run_config(task, "bad-keys", train={"output_dir": str(tmp_path / "run")})
    result = run_in_process("train", str(config), *overrides, cwd=tmp_path)
    assert_one_line_error(result, 2, *fragments)
    assert not (tmp_path / "run").exists()


def test_labels_the_data_exceed_are_one_line(task: Path, tmp_path: Path):
    config = write_run_config(task, "few", train={"output_dir": str(tmp_path / "run")})
    for overrides, fragment in [
        (["model.labels=[negative, neutral]"], "label 'positive', which is not one of "
                                               "model.labels=['negative', 'neutral']"),
        (["model.num_labels=2", "model.labels=[a, b, c]"], "model.labels names 3 classes"),
    ]:
        result = run_in_process("train", str(config), *overrides, cwd=tmp_path)
        assert_one_line_error(result, 2, fragment)
    assert not (tmp_path / "run").exists()
