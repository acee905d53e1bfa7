"""model.task=image-classification end to end through the CLI (in process), on a toy set of
three separable classes of 16x16 pictures in class folders: the conv-classifier preset
and Hugging Face folders (a tiny ViT and a tiny ResNet saved here with save_pretrained)
train with LoRA on the body and the new head in full; the loss goes down and each
evaluation logs accuracy and macro-F1.

What memfit exported is checked without memfit: the merged module loads strictly into the
user's class (HF folders with from_pretrained) and computes the logits the adapter,
loaded by PEFT onto the base, computes; its predictions score what memfit evaluated.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import assert_one_line_error, run_in_process, write_config
from PIL import Image
from safetensors.torch import load_file

from memfit.models.image_classifier import ConvClassifier

pytestmark = pytest.mark.usefixtures("quiet_transformers")
CLASSES = ("blank", "horizontal", "vertical")
SIZE = 16


def picture(kind: str, rng: np.random.Generator) -> np.ndarray:
    y, x = np.mgrid[:SIZE, :SIZE]
    phase = rng.integers(0, 8)
    stripes = {"horizontal": (y + phase) // 4 % 2, "vertical": (x + phase) // 4 % 2,
               "blank": np.zeros((SIZE, SIZE), int)}[kind]
    return (stripes * 200 + rng.integers(0, 40, (SIZE, SIZE))).astype(np.uint8)


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    """train/<class>/*.png (12 each) and eval/<class>/*.png (4 each)."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for split, count in (("train", 12), ("eval", 4)):
        for kind in CLASSES:
            (folder / split / kind).mkdir(parents=True)
            for index in range(count):
                Image.fromarray(picture(kind, rng)).save(folder / split / kind / f"{index}.png")
    return folder


def eval_images(task: Path) -> tuple[torch.Tensor, list[str]]:
    """The eval pictures as the config below makes them (gray, /255), and their classes."""
    files = sorted((task / "eval").glob("*/*.png"))
    images = torch.stack([torch.from_numpy(np.asarray(Image.open(file)) / 255).float()[None]
                          for file in files])
    return images, [file.parent.name for file in files]


def train(task: Path, name: str, model: dict, **adapter) -> tuple[Path, dict]:
    config = write_config(task / f"{name}.yaml", {
        "model": {**model, "task": "image-classification"},
        "data": {"path": "train", "eval_path": "eval", "format": "images",
                 "images": {"size": SIZE}},
        "adapter": {"kind": "lora", **adapter},
        "optimizer": {"lr": 1e-2},
        "train": {"max_steps": 40, "micro_batch_size": 12, "eval_every": 10,
                  "lr_schedule": "constant", "output_dir": f"runs/{name}"},
        "log": {"progress": False, "tensorboard": False}})
    result = run_in_process("train", str(config), cwd=task)
    assert result.returncode == 0, result.stderr
    run_dir = task / "runs" / name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [record["loss"] for record in records if "loss" in record]
    evaluations = [record for record in records if "eval_loss" in record]
    assert len(losses) == 40 and np.mean(losses[-5:]) < 0.6 * losses[0], losses
    assert [record["step"] for record in evaluations] == [0, 10, 20, 30, 40]
    assert all({"eval_accuracy", "eval_macro_f1"} <= set(record) for record in evaluations)
    assert evaluations[-1]["eval_loss"] < 0.6 * evaluations[0]["eval_loss"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_accuracy"] >= 0.9, summary
    return run_dir, summary


def accuracy(logits: torch.Tensor, labels: list[str], names) -> float:
    predicted = [names[index] for index in logits.argmax(-1).tolist()]
    return sum(p == a for p, a in zip(predicted, labels, strict=True)) / len(labels)


def test_preset_trains_with_lora_and_a_full_head_and_merges_into_the_users_class(task):
    from peft import PeftModel

    run_dir, summary = train(task, "preset", {"preset": "conv-classifier"},
                             targets=["conv", "all-linear"])
    assert "classifier: trained in full" in (run_dir / "adapters.txt").read_text()
    assert run_in_process("merge", str(run_dir), "--out", "merged", cwd=task).returncode == 0
    merged = ConvClassifier(channels=1, num_labels=3)
    merged.load_state_dict(load_file(task / "merged" / "model.safetensors"), strict=True)
    torch.manual_seed(0)  # train.seed: the preset's initial weights, the adapter's base
    adapted = PeftModel.from_pretrained(ConvClassifier(channels=1, num_labels=3),
                                        run_dir / "adapter").eval()
    images, labels = eval_images(task)
    with torch.no_grad():
        logits = merged.eval()(images)
        torch.testing.assert_close(logits, adapted(images), rtol=1e-4, atol=1e-5)
    assert accuracy(logits, labels, CLASSES) == pytest.approx(summary["eval_accuracy"])

    result = run_in_process("predict", str(run_dir), "eval", cwd=task)
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [record["file"] for record in records] == [
        str(Path("eval") / name / f"{i}.png") for name in CLASSES for i in range(4)]
    assert [record["label"] for record in records] == [
        CLASSES[index] for index in logits.argmax(-1).tolist()]

    planned = run_in_process("plan", str(task / "preset.yaml"), cwd=task)
    assert planned.returncode == 0, planned.stderr
    assert f"micro-batch 12 images of {SIZE}x{SIZE}" in planned.stdout


def test_hf_vit_folder_trains_and_merges_into_a_from_pretrained_folder(task):
    from peft import PeftModel
    from transformers import AutoModelForImageClassification, ViTConfig, ViTModel

    torch.manual_seed(0)
    ViTModel(ViTConfig(image_size=SIZE, patch_size=4, num_channels=1, hidden_size=32,
                       num_hidden_layers=2, num_attention_heads=4, intermediate_size=64),
             add_pooling_layer=False).save_pretrained(task / "vit")
    run_dir, summary = train(task, "vit", {"path": "vit"}, targets=["all-linear"])
    assert run_in_process("merge", str(run_dir), "--out", "merged-vit", cwd=task).returncode == 0
    merged = AutoModelForImageClassification.from_pretrained(task / "merged-vit").eval()
    assert merged.config.id2label == dict(enumerate(CLASSES))
    base = AutoModelForImageClassification.from_pretrained(
        task / "vit", num_labels=3)  # a random head: the adapter carries the trained one
    adapted = PeftModel.from_pretrained(base, run_dir / "adapter").eval()
    images, labels = eval_images(task)
    with torch.no_grad():
        logits = merged(pixel_values=images).logits
        torch.testing.assert_close(logits, adapted(pixel_values=images).logits,
                                   rtol=1e-4, atol=1e-5)
    assert accuracy(logits, labels, CLASSES) == pytest.approx(summary["eval_accuracy"])


def test_hf_resnet_full_fine_tune_exports_a_from_pretrained_folder(task):
    from transformers import AutoModelForImageClassification, ResNetConfig, ResNetModel

    torch.manual_seed(0)
    ResNetModel(ResNetConfig(num_channels=1, embedding_size=8, hidden_sizes=[8, 16],
                             depths=[1, 1], layer_type="basic")).save_pretrained(task / "resnet")
    run_dir, summary = train(task, "resnet", {"path": "resnet"}, kind="none")
    model = AutoModelForImageClassification.from_pretrained(run_dir / "model").eval()
    assert model.config.id2label == dict(enumerate(CLASSES))
    images, labels = eval_images(task)
    with torch.no_grad():
        logits = model(pixel_values=images).logits
    assert accuracy(logits, labels, CLASSES) == pytest.approx(summary["eval_accuracy"])


def test_an_eval_class_the_training_data_lacks_is_a_one_line_error(task, tmp_path):
    (task / "eval-extra" / "zebra").mkdir(parents=True)
    Image.fromarray(np.zeros((SIZE, SIZE), np.uint8)).save(task / "eval-extra/zebra/0.png")
    config = write_config(tmp_path / "bad.yaml", {
        "model": {"preset": "conv-classifier", "task": "image-classification"},
        "data": {"path": str(task / "train"), "eval_path": str(task / "eval-extra"),
                 "format": "images", "images": {"size": SIZE}},
        "train": {"output_dir": str(tmp_path / "run")}, "log": {"progress": False}})
    result = run_in_process("train", str(config), cwd=tmp_path)
    assert_one_line_error(result, 2, "data.eval_path", "class folder 'zebra' is not one of the "
                          "classes the model trains on (blank, horizontal, vertical")
    assert not (tmp_path / "run").exists()
