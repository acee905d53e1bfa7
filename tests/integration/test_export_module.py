"""``model.export_module``: a factory wrapping a Hugging Face model exports that inner model
so that transformers and PEFT load it alone, without the wrapper or memfit, and it
predicts what memfit evaluated."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import assert_one_line_error, run_in_process, tree_digest, write_config
from peft import PeftModel
from safetensors.torch import load_file

from memfit.config.load import read_yaml
from memfit.data import build_datasets, collate
from memfit.techniques.config_checks import from_mapping

# The documented pattern: the factory's module holds the transformers model as self.model
# and its forward computes the loss from the batch's fields.
FACTORY = '''
from torch import nn
from transformers import AutoModelForSequenceClassification


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = AutoModelForSequenceClassification.from_pretrained({base!r})

    def forward(self, input_ids, attention_mask, targets):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          labels=targets).loss


def classifier():
    return Classifier()
'''


pytestmark = pytest.mark.usefixtures("quiet_transformers")


def write_base(folder: Path) -> Path:
    """A tiny random-weight BERT classifier saved as a normal Hugging Face folder."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=32, num_labels=3)
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def write_token_data(path: Path, rows: int = 32, length: int = 12) -> Path:
    generator = np.random.default_rng(0)
    input_ids = generator.integers(1, 64, size=(rows, length))
    np.savez(path, input_ids=input_ids, attention_mask=np.ones_like(input_ids),
             targets=input_ids[:, 0] % 3)
    return path


def wrapper_config(tmp_path: Path, *overrides: str) -> list[str]:
    factory = tmp_path / "wrapped.py"
    factory.write_text(FACTORY.format(base=str(write_base(tmp_path / "base"))))
    config = write_config(tmp_path / "run.yaml", {
        "model": {"factory": f"{factory}:classifier", "task": "custom",
                  "export_module": "model"},
        "data": {"path": str(write_token_data(tmp_path / "tokens.npz")), "format": "tensors",
                 "eval_fraction": 0.25},
        "train": {"max_steps": 4, "micro_batch_size": 8, "output_dir": str(tmp_path / "run")},
        "optimizer": {"lr": 5e-2},
        "log": {"tensorboard": False, "progress": False}})
    return [str(config), *overrides]


def eval_split(run_dir: Path) -> dict[str, torch.Tensor]:
    config = from_mapping(read_yaml(run_dir / "config.yaml"))
    return collate(list(build_datasets(config.data, None, seed=config.train.seed).eval))


def logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=batch["input_ids"],
                            attention_mask=batch["attention_mask"]).logits


def test_adapter_and_merge_load_onto_the_plain_hugging_face_model(tmp_path: Path):
    from transformers import AutoModelForSequenceClassification

    result = run_in_process("train", *wrapper_config(
        tmp_path, "adapter.kind=lora", "adapter.rank=4", "adapter.targets=[query, value]",
        "adapter.trainable_modules=[classifier]"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "run"
    result = run_in_process("merge", "--trust-code",
                            str(run_dir), "--out", str(tmp_path / "merged"),
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr

    batch = eval_split(run_dir)
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "base")
    before = logits(plain, batch)
    adapted = PeftModel.from_pretrained(plain, run_dir / "adapter")
    after = logits(adapted, batch)
    assert not torch.allclose(after, before, atol=1e-4), "the adapter changed nothing"
    loss = torch.nn.functional.cross_entropy(after, batch["targets"]).item()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert loss == pytest.approx(summary["eval_loss_after"], rel=1e-5)

    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged")
    assert not any("lora" in name for name in merged.state_dict())
    torch.testing.assert_close(logits(merged, batch), after, rtol=1e-5, atol=1e-5)


def test_full_fine_tune_exports_the_inner_model_as_a_hugging_face_folder(tmp_path: Path):
    from transformers import AutoModelForSequenceClassification

    result = run_in_process("train", *wrapper_config(tmp_path, "adapter.kind=none"),
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "run"
    batch = eval_split(run_dir)
    exported = AutoModelForSequenceClassification.from_pretrained(run_dir / "model")
    loss = torch.nn.functional.cross_entropy(logits(exported, batch), batch["targets"]).item()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert loss == pytest.approx(summary["eval_loss_after"], rel=1e-5)
    assert set(load_file(run_dir / "model/model.safetensors")) <= set(exported.state_dict())


@pytest.mark.parametrize(("name", "fragments"), [
    ("modle", ["model.export_module='modle'", "has no submodule 'modle'",
               "PreTrainedModel) are at: model"]),
    ("model.classifier", ["model.export_module='model.classifier' is a Linear",
                          "not a transformers PreTrainedModel", "are at: model"]),
])
def test_an_export_module_that_is_not_a_transformers_model_is_refused_before_training(
        tmp_path: Path, name: str, fragments: list[str]):
    arguments = wrapper_config(tmp_path, f"model.export_module={name}", "adapter.kind=lora",
                               "adapter.targets=[query]")
    before = tree_digest(tmp_path)
    result = run_in_process("train", *arguments, cwd=tmp_path)
    assert_one_line_error(result, 2, *fragments)
    assert tree_digest(tmp_path) == before


def test_adapters_outside_the_export_module_are_refused_before_training(tmp_path: Path):
    arguments = wrapper_config(tmp_path, "model.export_module=model.bert", "adapter.kind=lora",
                               "adapter.targets=[query]", "adapter.trainable_modules=[classifier]")
    before = tree_digest(tmp_path)
    result = run_in_process("train", *arguments, cwd=tmp_path)
    assert_one_line_error(result, 2, "model.export_module='model.bert' leaves out",
                          "classifier", "adapter.restrict_to=[model.bert]")
    assert tree_digest(tmp_path) == before
