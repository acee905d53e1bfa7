"""A ``model.factory`` that loads a Hugging Face folder with ``from_pretrained`` (the way a
user wraps a pretrained BERT) is planned — with the real model's parameters — and
``memfit report`` of a finished run of it shows the plan."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import run_in_process, write_config

from memfit.plan import meta
from memfit.plan.planner import load_plan_config

# num_labels=3 is a config field passed through from_pretrained (the saved encoder has
# no head): planning must build the same 3-way head the real load does.
FACTORY = '''
from torch import nn
from transformers import AutoModelForSequenceClassification


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.bert = AutoModelForSequenceClassification.from_pretrained({folder!r}, num_labels=3)

    def forward(self, tokens, classes):
        return self.bert(input_ids=tokens, labels=classes).loss


def build():
    return Classifier()
'''


# It also loads weights as many factories do (torch warns on meta that this is a no-op).
COUNTER = '''

def counted():
    from pathlib import Path

    import torch

    with open(Path(__file__).with_name("calls.txt"), "a") as calls:
        calls.write("built\\n")
    model = build()
    model.load_state_dict({name: torch.zeros(tensor.shape, dtype=tensor.dtype, device="cpu")
                           for name, tensor in model.state_dict().items()})
    return model
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A saved random-weight BERT encoder, the factory module that loads it, its data and
    a config training it for two steps."""
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("pretrained-factory")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=32)).save_pretrained(folder / "bert")
    (folder / "classifier.py").write_text(FACTORY.format(folder=str(folder / "bert")))
    generator = np.random.default_rng(0)
    np.savez(folder / "data.npz", tokens=generator.integers(0, 100, size=(16, 12)),
             classes=generator.integers(0, 3, size=16))
    write_config(folder / "config.yaml", {
        "model": {"factory": f"{folder / 'classifier.py'}:build", "task": "custom"},
        "data": {"path": str(folder / "data.npz"), "format": "tensors"},
        "train": {"max_steps": 2, "micro_batch_size": 4, "output_dir": str(folder / "run")},
        "log": {"progress": False, "tensorboard": False}})
    return folder


def real_model(project: Path) -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("classifier", project / "classifier.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build()


def test_plan_builds_the_pretrained_architecture_on_meta(project: Path):
    real = real_model(project)
    config = load_plan_config(project / "config.yaml", [])
    planned = meta.build(meta.BuildInputs.of(config, "cpu")).model
    assert {p.device.type for p in planned.parameters()} == {"meta"}
    assert ({name: p.shape for name, p in planned.named_parameters()}
            == {name: p.shape for name, p in real.named_parameters()})
    assert planned.bert.classifier.out_features == 3

    # The same factory, counting its calls in a file: planning every strategy runs it once,
    # and torch's "copying from a non-meta parameter" is not shown, even with --debug.
    counted = project / "counted.py"
    counted.write_text((project / "classifier.py").read_text() + COUNTER)
    result = run_in_process("--debug", "plan", str(project / "config.yaml"), "--budget",
                            "1GiB", f"model.factory={counted}:counted", "--device", "cpu",
                            "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    assert (project / "calls.txt").read_text() == "built\n"
    assert "non-meta" not in result.stderr
    plan = json.loads(result.stdout)
    assert len(plan["strategies"]) > 20
    # Full fine-tuning in fp32: every parameter and buffer of the real model, once each.
    tensors = {t.data_ptr(): t for t in [*real.parameters(), *real.buffers()]}
    real_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    assert plan["config"]["bytes"]["weights"] == real_bytes


def test_report_of_a_factory_run_leaves_the_plan_to_memfit_plan(project: Path):
    """memfit report never imports the code a run folder names; the page says how to plan
    it, and planning the run's config.yaml (the user's explicit choice) works."""
    result = run_in_process("train", str(project / "config.yaml"), cwd=project)
    assert result.returncode == 0, result.stderr
    result = run_in_process("report", str(project / "run"), cwd=project)
    assert result.returncode == 0, result.stderr
    page = (project / "run" / "report.html").read_text()
    assert "no plan" in page and "memfit plan" in page and "plan (device=cpu)" not in page
    result = run_in_process("plan", str(project / "run" / "config.yaml"), "--device", "cpu",
                            "--budget", "1GiB", cwd=project)
    assert result.returncode == 0, result.stderr
