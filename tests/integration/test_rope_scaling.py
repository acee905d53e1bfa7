"""model.rope_scaling end to end: sequences past the native window train only with it, and
the run's config.yaml, a resume, the exported model/ and memfit merge all carry it, so the
folder transformers loads has the trained model's positions and computes its logits."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml
from cli_helpers import run_in_process, write_config

from memfit.config.load import read_yaml
from memfit.techniques.config_checks import from_mapping
from memfit.training.build import load_base, seed_everything

NATIVE = 1024  # tiny-llama's max_position_embeddings
LENGTH = 1100  # tokens per block: past the native window


def long_text(path: Path, rows: int = 4) -> Path:
    """Rows of 1,200 bytes (the byte-level tokenizer's tokens), packed into LENGTH blocks."""
    words = ["apple", "river", "stone", "cloud", "ember", "field", "glass", "honey"]
    with path.open("w") as handle:
        for row in range(rows):
            text = " ".join(words[(row + k) % len(words)] for k in range(240))[:1200]
            handle.write(json.dumps({"text": text}) + "\n")
    return path


def run_config(tmp_path: Path, name: str, **model) -> Path:
    """A 2-step config on long text for the tiny Llama (or ``model``), written to a file."""
    return write_config(tmp_path / f"{name}.yaml", {
        "model": {"preset": "tiny-llama", **model},
        "data": {"path": str(long_text(tmp_path / "long.jsonl")), "format": "text",
                 "max_length": LENGTH, "eval_fraction": 0},
        "train": {"max_steps": 2, "micro_batch_size": 1, "output_dir": str(tmp_path / name)},
        "optimizer": {"lr": 1e-2}, "log": {"progress": False, "tensorboard": False}})


def logits(model: torch.nn.Module, length: int = LENGTH) -> torch.Tensor:
    input_ids = torch.randint(3, 250, (1, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model.eval()(input_ids=input_ids).logits


def test_past_the_window_without_scaling_is_one_line_naming_the_way_beyond(tmp_path: Path):
    result = run_in_process("train", str(run_config(tmp_path, "run")), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"memfit: error: data.max_length={LENGTH} is beyond the context of "
        "model.preset=tiny-llama (max_position_embeddings=1024); set data.max_length to 1024 "
        "or less, or extend the context with model.rope_scaling.type=yarn "
        "model.rope_scaling.factor=2")
    assert not (tmp_path / "run").exists()
    gpt2 = run_in_process("train", str(run_config(tmp_path, "gpt2", preset="gpt2")),
                          "model.rope_scaling.type=yarn", "model.rope_scaling.factor=2",
                          cwd=tmp_path)
    assert gpt2.returncode == 2 and gpt2.stderr.strip() == (
        "memfit: error: model.rope_scaling.type=yarn: model.preset=gpt2 has no rotary position "
        "embeddings to scale (its positions are learned or absent); set "
        "model.rope_scaling.type=none")


def test_a_full_fine_tune_past_the_window_exports_and_resumes_with_its_scaling(tmp_path: Path):
    from transformers import AutoModelForCausalLM

    from memfit.training.trained_model import trained_model

    config = run_config(tmp_path, "run", rope_scaling={"type": "yarn", "factor": 2})
    result = run_in_process("train", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "run"
    saved = read_yaml(run_dir / "config.yaml")["model"]["rope_scaling"]
    assert saved == {"type": "yarn", "factor": 2.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0}
    exported = json.loads((run_dir / "model" / "config.json").read_text())
    assert exported["max_position_embeddings"] == 2 * NATIVE
    assert exported["rope_parameters"] == {"rope_type": "yarn", "factor": 2.0,
                                           "rope_theta": 10000.0,
                                           "original_max_position_embeddings": NATIVE}
    loaded = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    assert loaded.model.rotary_emb.attention_scaling > 1  # yarn's temperature applies
    run = from_mapping(read_yaml(run_dir / "config.yaml"))
    model, _, _ = trained_model(run_dir, run, "memfit predict")  # model/ read as memfit reads it
    torch.testing.assert_close(logits(loaded), logits(model))

    resumed = run_in_process("train", "--resume", str(run_dir), "train.max_steps=3",
                             cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    steps = [json.loads(line).get("step") for line in
             (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(step for step in steps if step is not None) == 3


def test_lora_on_a_folder_merges_into_a_folder_with_the_same_positions(tmp_path: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from memfit.models.presets import tiny_llama

    base = tmp_path / "base"
    AutoModelForCausalLM.from_config(tiny_llama()).save_pretrained(base)
    config = yaml.safe_load(run_config(tmp_path, "run").read_text())
    config["model"] = {"path": str(base), "rope_scaling": {"type": "linear", "factor": 2}}
    config["adapter"] = {"kind": "lora", "rank": 4}
    result = run_in_process("train", str(write_config(tmp_path / "lora.yaml", config)),
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "run"
    merged = run_in_process("merge", str(run_dir), "--out", str(tmp_path / "merged"),
                            cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr

    folder = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert folder.config.max_position_embeddings == 2 * NATIVE
    assert folder.config.rope_parameters == {"rope_type": "linear", "factor": 2.0,
                                             "rope_theta": 10000.0}
    run = from_mapping(read_yaml(run_dir / "config.yaml"))
    seed_everything(run.train.seed)
    trained = PeftModel.from_pretrained(load_base(run).model, run_dir / "adapter")
    torch.testing.assert_close(logits(folder), logits(trained), rtol=1e-4, atol=1e-4)
    unscaled = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0}, max_position_embeddings=NATIVE)
    assert not torch.allclose(logits(unscaled), logits(folder), atol=1e-3)  # it matters
