"""A GGUF file as model.path, end to end: LoRA and QLoRA train from it (the file, or a
folder holding it), the plan is the plan of the same model as a Hugging Face folder,
merge writes a plain Hugging Face folder, and a damaged file is one line, exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_line_error, run_in_process, write_config
from gguf_files import write_tiny_llama_gguf

from memfit.config.schema import ModelConfig
from memfit.models.load import load_model
from memfit.techniques.config_checks import load_config

GGUF_LINE = "memfit: warning: model.path={} is a GGUF file: transformers loads its F32 tensors"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """``tiny.gguf`` and ``hf/`` (the same model and tokenizer as a Hugging Face folder)."""
    folder = tmp_path_factory.mktemp("gguf")
    write_tiny_llama_gguf(folder / "tiny.gguf", folder / "hf")
    return folder


def run_config(tmp_path: Path, model_path: Path, instructions: Path, name: str,
               **adapter) -> Path:
    return write_config(tmp_path / f"{name}.yaml", {
        "model": {"path": str(model_path)},
        "data": {"path": str(instructions), "format": "instruction", "max_length": 64,
                 "eval_fraction": 0},
        "adapter": {"kind": "lora", "rank": 4, **adapter},
        "train": {"max_steps": 2, "micro_batch_size": 4, "output_dir": str(tmp_path / name)},
        "optimizer": {"lr": 1e-2}, "log": {"progress": False, "tensorboard": False}})


def test_a_gguf_loads_the_weights_and_tokenizer_of_the_same_model_as_a_folder(models: Path):
    with pytest.warns(UserWarning, match="is a GGUF file"):
        from_gguf = load_model(ModelConfig(path=str(models / "tiny.gguf")))
    from_folder = load_model(ModelConfig(path=str(models / "hf")))
    input_ids = torch.randint(3, 250, (2, 12))
    with torch.no_grad():  # q/k rows come back from llama.cpp's rotary order exactly
        torch.testing.assert_close(from_gguf.model(input_ids).logits,
                                   from_folder.model(input_ids).logits, rtol=0, atol=0)
    text = "Repeat twice: <s> ünï"
    assert from_gguf.tokenizer(text).input_ids == from_folder.tokenizer(text).input_ids
    assert from_gguf.tokenizer.pad_token_id == 0
    assert not hasattr(from_gguf.model, "hf_quantizer")  # a plain model: save_pretrained works


def test_lora_trains_from_a_gguf_file_and_merges_into_a_hugging_face_folder(
        tmp_path: Path, models: Path, instructions: Path, quiet_transformers):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = models / "tiny.gguf"
    result = run_in_process("train", str(run_config(tmp_path, gguf, instructions, "run")),
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0].startswith(GGUF_LINE.format(gguf))
    assert "dequantized into model.dtype=float32" in result.stderr
    assert "Converting and de-quantizing" not in result.stderr  # transformers' own bar
    assert list(json.loads((tmp_path / "run/base.json").read_text())) == ["tiny.gguf"]

    result = run_in_process("merge", str(tmp_path / "run"), "--out", str(tmp_path / "merged"),
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    merged_config = json.loads((tmp_path / "merged/config.json").read_text())
    assert "quantization_config" not in merged_config
    assert (tmp_path / "merged/model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    assert not any("lora" in name for name in merged.state_dict())
    assert tokenizer("hi").input_ids == [ord("h") + 3, ord("i") + 3]


def test_qlora_trains_from_a_folder_holding_one_gguf(tmp_path: Path, models: Path,
                                                     instructions: Path):
    folder = tmp_path / "download"
    folder.mkdir()
    shutil.copy(models / "tiny.gguf", folder / "tiny.gguf")
    config = run_config(tmp_path, folder, instructions, "qlora", kind="qlora")
    result = run_in_process("train", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert GGUF_LINE.format(folder / "tiny.gguf") in result.stderr
    weights = json.loads((tmp_path / "qlora/summary.json").read_text()
                         )["memory_peak_by_category"]["weights"]
    # the base was quantized after loading (transformers will not combine GGUF with
    # bitsandbytes): 4-bit blocks, well below the float32 weights' 0.5 MiB
    assert weights < 0.25 * 2**20, weights


def test_the_plan_of_a_gguf_is_the_plan_of_the_same_model_as_a_folder(
        tmp_path: Path, models: Path, instructions: Path):
    """Each plan row is an ``estimate`` (one trace per strategy): QLoRA's and LoRA's are
    the folder's to the byte, built on meta from the GGUF's metadata alone."""
    from memfit.plan.itemize import estimate

    for kind in ("qlora", "lora"):
        gguf, folder = (load_config(str(run_config(tmp_path, models / name, instructions,
                                                   f"plan-{name}", kind=kind)), [])
                        for name in ("tiny.gguf", "hf"))
        assert estimate(gguf, "cpu").to_json() == estimate(folder, "cpu").to_json()


def test_generate_answers_from_a_gguf_file(tmp_path: Path, models: Path):
    result = run_in_process("generate", str(models / "tiny.gguf"), "--prompt", "hi",
                            "--max-new-tokens", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert GGUF_LINE.format(models / "tiny.gguf") in result.stderr


@pytest.mark.parametrize("damage", ["cut in half", "random bytes", "two files"])
def test_a_damaged_gguf_is_one_line_exit_2(tmp_path: Path, models: Path, instructions: Path,
                                           damage: str):
    whole = (models / "tiny.gguf").read_bytes()
    path = tmp_path / "x.gguf"
    if damage == "cut in half":
        path.write_bytes(whole[:len(whole) // 2])
        expected = (f"{path} is truncated or not a GGUF file: {len(whole) // 2} bytes, cut "
                    "short or damaged")
    elif damage == "random bytes":
        path.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
        expected = f"{path} is truncated or not a GGUF file: it does not start with the magic"
    else:
        path = tmp_path / "download"
        path.mkdir()
        for name in ("tiny-Q8_0.gguf", "tiny-F32.gguf"):
            (path / name).write_bytes(whole)
        expected = f"model.path={path} holds 2 GGUF files (tiny-F32.gguf, tiny-Q8_0.gguf)"
    config = run_config(tmp_path, path, instructions, "run")
    for command in (["train", str(config)], ["plan", str(config), "--budget", "1GiB"]):
        result = run_in_process(*command, cwd=tmp_path)
        assert_one_line_error(result, 2, expected)
    assert not (tmp_path / "run").exists()
