"""`memfit merge`: adapters folded into the base. The merged model computes what the
adapter model computed (QLoRA bases dequantised first) and has no LoRA modules left."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from cli_helpers import run_in_process, tiny_run_arguments
from factories import regressor, write_regression_data
from peft import PeftModel
from safetensors.torch import load_file

from memfit.config.load import read_yaml
from memfit.merge import merge_run
from memfit.techniques.config_checks import from_mapping, load_config
from memfit.training.api import train
from memfit.training.build import load_base, seed_everything


def train_in_process(arguments: list[str]) -> Path:
    """Train in process from ``[CONFIG.yaml] key=value ...``; returns the run folder."""
    config_path = arguments[0] if arguments[0].endswith(".yaml") else None
    return train(load_config(config_path, arguments[1 if config_path else 0:])).output_dir


def adapter_model(run_dir: Path) -> torch.nn.Module:
    """The model as trained: the rebuilt (quantized) base with the saved adapter."""
    config = from_mapping(read_yaml(run_dir / "config.yaml"))
    seed_everything(config.train.seed)
    return PeftModel.from_pretrained(load_base(config).model, run_dir / "adapter").eval()


def test_qlora_run_merges_into_a_plain_hugging_face_folder(tmp_path: Path, instructions: Path):
    from transformers import AutoModelForCausalLM

    run_dir = train_in_process(tiny_run_arguments(
        instructions, tmp_path / "run", "train.max_steps=3", "optimizer.lr=1e-2",
        "adapter.kind=qlora", "adapter.rank=4", "adapter.targets=[attention, mlp]",
        "memory.gradient_checkpointing=true", "memory.chunked_loss=true",
        "memory.loss_chunk_tokens=16", "log.tensorboard=false", "data.eval_fraction=0"))
    result = run_in_process("merge", "--trust-code",
                            str(run_dir), "--out", str(tmp_path / "merged"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"merged model  {tmp_path / 'merged'}/" in result.stdout

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert not any("lora" in name for name in merged.state_dict())
    assert "quantization_config" not in json.loads((tmp_path / "merged/config.json").read_text())
    input_ids = torch.randint(3, 250, (2, 24))
    with torch.no_grad():
        expected = adapter_model(run_dir)(input_ids=input_ids).logits
        actual = merged(input_ids=input_ids).logits
    torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-3)


def test_plain_module_merge_loads_strictly_into_the_factory_module(tmp_path: Path):
    data = write_regression_data(tmp_path / "regression.npz")
    run_dir = train_in_process([
        "model.factory=factories:regressor", "model.task=custom", f"data.path={data}",
        "data.format=tensors", "train.max_steps=4", "optimizer.lr=5e-2", "adapter.kind=lora",
        "adapter.rank=2", "adapter.targets=[all-linear]", f"train.output_dir={tmp_path / 'run'}",
        "log.tensorboard=false", "log.progress=false"])
    out = merge_run(run_dir, tmp_path / "merged", trust_code=True)
    model = regressor().eval()
    model.load_state_dict(load_file(out / "model.safetensors"), strict=True)
    inputs = torch.randn(5, 8)
    with torch.no_grad():
        expected = adapter_model(run_dir).base_model.model.net(inputs)
        torch.testing.assert_close(model.net(inputs), expected)


def test_merging_a_run_without_adapters_is_a_one_line_error(tmp_path: Path, capsys):
    from memfit.cli import main

    (tmp_path / "run").mkdir()
    assert main(["merge", "--trust-code", str(tmp_path / "run"), "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err == (f"memfit: error: memfit merge {tmp_path / 'run'}: no "
                                       "config.yaml there (not a run folder)\n")
    assert not (tmp_path / "x").exists()


def test_qlora_run_on_a_hugging_face_folder_merges(tmp_path: Path, instructions: Path):
    """demo-base loads from its folder through transformers' bitsandbytes quantizer, which
    refuses a dtype cast until memfit has dequantized and unmarked it."""
    from transformers import AutoModelForCausalLM

    run_dir = train_in_process(tiny_run_arguments(
        instructions, tmp_path / "run", "model.preset=demo-base", "train.max_steps=2",
        "optimizer.lr=1e-2", "adapter.kind=qlora", "adapter.rank=4", "log.tensorboard=false",
        "data.eval_fraction=0"))
    result = run_in_process("merge", "--trust-code",
                            str(run_dir), "--out", str(tmp_path / "merged"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    input_ids = torch.randint(3, 250, (2, 24))
    with torch.no_grad():
        expected = adapter_model(run_dir)(input_ids=input_ids).logits
        actual = merged(input_ids=input_ids).logits
    torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-3)
