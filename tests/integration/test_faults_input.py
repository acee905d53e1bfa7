"""Bad input is one line, exit 2, before anything is written (issue #12 item 8); small
data is visible and train.epochs counts real passes (item 9)."""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import pytest
from cli_helpers import (
    assert_one_line_error,
    run_in_process,
    tiny_run_arguments,
    tree_digest,
    write_config,
)
from factories import write_regression_data

from memfit.config.ignored import IgnoredKeyWarning


def refused(tmp_path: Path, arguments: list[str], *fragments: str, command: str = "train"
            ) -> str:
    """Run ``memfit COMMAND ARGUMENTS`` in tmp_path; assert the one-line exit-2 error with
    ``fragments``, no run folder, and every file the user had unchanged."""
    before = tree_digest(tmp_path)
    result = run_in_process(command, *arguments, cwd=tmp_path)
    line = assert_one_line_error(result, 2, *fragments)
    assert tree_digest(tmp_path) == before
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()
    return line


def instruction_lines(count: int) -> list[bytes]:
    return [json.dumps({"prompt": f"say {i}", "response": f"{i} {i}"}).encode() + b"\n"
            for i in range(count)]


# --- data files -------------------------------------------------------------------------

@pytest.mark.parametrize("name, content, offset, line", [
    # "café" written as latin-1: 0xe9 starts a 3-byte sequence the next byte does not continue.
    ("rows.jsonl", b"".join(instruction_lines(3)) + '{"prompt": "caf\xe9", '.encode("latin-1")
     + b'"response": "r"}\n', sum(map(len, instruction_lines(3))) + 15, 4),
    ("rows.json", b'[{"prompt": "a", "response": "b"},\n {"prompt": "\xff", "response": "b"}]',
     48, 2),
    ("rows.csv", b"prompt,response\na,b\ncaf\xe9,d\n", 23, 3),
    ("rows.txt", b"one paragraph\n\nand caf\xe9\n", 22, 3),
])
def test_non_utf8_data_names_the_file_and_byte_offset(tmp_path: Path, name: str, content: bytes,
                                                      offset: int, line: int):
    data = tmp_path / name
    data.write_bytes(content)
    data_format = "text" if name.endswith(".txt") else "instruction"
    refused(tmp_path, tiny_run_arguments(data, tmp_path / "out", f"data.format={data_format}"),
            name, "is not UTF-8", f"byte offset {offset} (line {line})")


def test_jsonl_parse_error_names_the_line(tmp_path: Path):
    data = tmp_path / "rows.jsonl"
    data.write_bytes(b"".join(instruction_lines(5)) + b'{"prompt": "x", "response": \n'
                     + b"".join(instruction_lines(2)))
    refused(tmp_path, tiny_run_arguments(data, tmp_path / "out"),
            "rows.jsonl", "line 6 is not valid JSON")


# --- model folders ----------------------------------------------------------------------

@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    """A real Hugging Face folder: a tiny Llama saved with save_pretrained."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from memfit.models.tokenizers import BYTE_VOCAB_SIZE

    config = LlamaConfig(vocab_size=BYTE_VOCAB_SIZE, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64)
    folder = tmp_path / "model"
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def model_arguments(tmp_path: Path, folder: Path, *extra: str) -> list[str]:
    data = tmp_path / "rows.jsonl"
    data.write_bytes(b"".join(instruction_lines(8)))
    config = write_config(tmp_path / "run.yaml", {
        "model": {"path": str(folder)},
        "data": {"path": str(data), "format": "instruction", "max_length": 32},
        "train": {"output_dir": str(tmp_path / "out"), "max_steps": 1},
        "log": {"progress": False, "tensorboard": False}})
    return [str(config), *extra]


def test_truncated_safetensors_names_the_file(tmp_path: Path, model_folder: Path):
    weights = model_folder / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, size // 2)
    refused(tmp_path, model_arguments(tmp_path, model_folder),
            "model.safetensors is truncated or not a safetensors file",
            f"{size // 2} bytes, its header describes {size}")


@pytest.mark.usefixtures("quiet_transformers")
def test_a_damaged_tokenizer_is_refused_not_replaced(tmp_path: Path, model_folder: Path):
    """A folder without tokenizer files falls back to memfit's byte-level tokenizer; one
    whose tokenizer is damaged must not silently train with another tokenizer."""
    from memfit.demo import demo_assets_dir

    tokenizer = (demo_assets_dir() / "base" / "tokenizer.json").read_bytes()
    (model_folder / "tokenizer.json").write_bytes(tokenizer[:300])
    refused(tmp_path, model_arguments(tmp_path, model_folder),
            "its tokenizer (tokenizer.json) cannot be loaded")


@pytest.mark.parametrize("text, fragment", [
    ("{not json", "config.json is not valid JSON"),
    ("[1, 2]", "config.json must hold a JSON object"),
])
def test_config_json_that_is_not_a_json_object(tmp_path: Path, model_folder: Path, text: str,
                                               fragment: str):
    (model_folder / "config.json").write_text(text)
    refused(tmp_path, model_arguments(tmp_path, model_folder), fragment)


# --- numbers outside their domain --------------------------------------------------------

@pytest.mark.parametrize("override, fragment", [
    ("optimizer.lr=nan", "optimizer.lr must be above 0 and finite, got nan"),
    ("optimizer.lr=.inf", "optimizer.lr must be above 0 and finite, got inf"),
    ("optimizer.betas=[0.9, 1.0]", "optimizer.betas must be two numbers each in [0, 1)"),
    ("optimizer.betas=[.nan, 0.9]", "optimizer.betas must be two numbers each in [0, 1)"),
    ("optimizer.eps=0", "optimizer.eps must be above 0 and finite, got 0.0"),
    ("optimizer.eps=.nan", "optimizer.eps must be above 0 and finite, got nan"),
    ("optimizer.weight_decay=nan", "optimizer.weight_decay must be 0 or more and finite"),
    ("train.max_grad_norm=nan", "train.max_grad_norm must be above 0 and finite"),
    ("train.max_grad_norm=.inf", "train.max_grad_norm must be above 0 and finite"),
    ("train.epochs=nan", "train.epochs must be above 0 and finite, got nan"),
    ("adapter.alpha=nan", "adapter.alpha must be above 0 and finite, got nan"),
    ("adapter.dropout=1.0", "adapter.dropout must be in [0, 1), got 1.0"),
    ("optimizer.galore.scale=.inf", "optimizer.galore.scale must be above 0 and finite"),
    ("memory.checkpoint_blocks=-1", "memory.checkpoint_blocks must be 0 or more, got -1"),
    ("memory.offload_blocks=1.5",
     "memory.offload_blocks=1.5 as a fraction of the blocks must be in (0, 1]"),
    ("memory.checkpoint_blocks=0.0",
     "memory.checkpoint_blocks=0.0 as a fraction of the blocks must be in (0, 1]"),
])
def test_number_outside_its_domain(tmp_path: Path, instructions: Path, override: str,
                                   fragment: str):
    refused(tmp_path, tiny_run_arguments(instructions, tmp_path / "out", override,
                                         "train.max_steps=1", "log.tensorboard=false"),
            fragment)


# --- memory.checkpoint_blocks / memory.offload_blocks -----------------------------------------

@pytest.mark.parametrize("overrides, fragments", [
    (["memory.gradient_checkpointing=true", "memory.checkpoint_blocks=3"],
     ["memory.checkpoint_blocks=3 is beyond the 2 blocks of model.preset=tiny-llama; "
      "choose 0..2 or a fraction"]),
    (["memory.activation_offload=true", "memory.offload_blocks=5"],
     ["memory.offload_blocks=5 is beyond the 2 blocks of model.preset=tiny-llama; "
      "choose 0..2 or a fraction"]),
])
def test_train_block_count_beyond_the_depth(tmp_path: Path, instructions: Path,
                                            overrides: list[str], fragments: list[str]):
    refused(tmp_path, tiny_run_arguments(instructions, tmp_path / "out", *overrides,
                                         "train.max_steps=1", "log.tensorboard=false"),
            *fragments)


def test_plan_block_count_beyond_a_large_presets_depth(tmp_path: Path):
    """Planned from 2- and 3-layer stand-ins, still refused against the 32 blocks."""
    refused(tmp_path, ["model.preset=llama-3.1-8b", "memory.gradient_checkpointing=true",
                       "memory.checkpoint_blocks=40", "--budget", "24GiB"],
            "memory.checkpoint_blocks=40 is beyond the 32 blocks of model.preset=llama-3.1-8b; "
            "choose 0..32 or a fraction", command="plan")


@pytest.mark.parametrize("override", ["memory.checkpoint_blocks=1.5", "train.epochs=nan"])
def test_plan_number_outside_its_domain_prints_no_table(tmp_path: Path, override: str):
    """memfit plan checks numbers as training does, before a line of the table."""
    result = run_in_process("plan", "model.preset=tiny-llama", override, "--device", "cpu",
                            cwd=tmp_path)
    assert_one_line_error(result, 2, override.split("=")[0])
    assert result.stdout == ""


# --- data.max_length beyond the model's context --------------------------------------------

def test_plan_max_length_beyond_the_context(tmp_path: Path):
    refused(tmp_path, ["model.preset=tiny-llama", "data.max_length=4096", "--budget", "1GiB",
                       "--device", "cpu"],
            "data.max_length=4096", "max_position_embeddings=1024", command="plan")


def test_plan_of_a_large_preset_beyond_its_context(tmp_path: Path):
    refused(tmp_path, ["model.preset=llama-3.1-8b", "data.max_length=200000", "--budget",
                       "24GiB"],
            "data.max_length=200000", "max_position_embeddings=131072", command="plan")


def test_train_max_length_beyond_the_context(tmp_path: Path, instructions: Path):
    refused(tmp_path, tiny_run_arguments(instructions, tmp_path / "out", "data.max_length=2048",
                                         "train.max_steps=1", "log.tensorboard=false"),
            "data.max_length=2048", "model.preset=tiny-llama", "max_position_embeddings=1024")


def test_train_max_length_beyond_a_model_folders_context(tmp_path: Path, model_folder: Path):
    refused(tmp_path, model_arguments(tmp_path, model_folder, "data.max_length=65"),
            "data.max_length=65", f"model.path={model_folder}", "max_position_embeddings=64")


# --- combinations that would silently do nothing ---------------------------------------------

def test_float16_weights_contradict_bf16_pure(tmp_path: Path, instructions: Path):
    refused(tmp_path, tiny_run_arguments(instructions, tmp_path / "out", "model.dtype=float16",
                                         "precision=bf16-pure", "train.max_steps=1"),
            "model.dtype=float16", "precision=bf16-pure")


def test_float16_weights_with_fp16_scaler_are_refused(tmp_path: Path, instructions: Path):
    refused(tmp_path, tiny_run_arguments(instructions, tmp_path / "out", "model.dtype=float16",
                                         "precision=fp16", "train.max_steps=1"),
            "model.dtype=float16", "precision=fp16", "adapter.kind=none")


@pytest.mark.parametrize("overrides, warned", [
    (["adapter.kind=none", "adapter.rank=16"], "adapter.rank=16 is ignored: adapter.kind=none"),
    (["adapter.kind=none", "adapter.quantization=nf4"],
     "adapter.quantization=nf4 is ignored: adapter.kind=none"),
    (["adapter.kind=lora", "adapter.quantization=int8"],
     "adapter.quantization=int8 is ignored: only adapter.kind=qlora"),
    (["optimizer.galore.rank=4"], "optimizer.galore.rank=4 is ignored: optimizer.name=adamw"),
    (["memory.loss_chunk_tokens=64"],
     "memory.loss_chunk_tokens=64 is ignored: it applies with memory.chunked_loss=true"),
    (["optimizer.name=sgd", "optimizer.betas=[0.8, 0.9]"],
     "optimizer.betas=[0.8, 0.9] is ignored: optimizer.name=sgd"),
])
def test_ignored_keys_are_warned(tmp_path: Path, instructions: Path, overrides: list[str],
                                 warned: str):
    with pytest.warns(IgnoredKeyWarning, match=warned.replace("[", r"\[")):
        result = run_in_process("train", *tiny_run_arguments(instructions, tmp_path / "out",
                                                             *overrides),
                                "--print-config", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_demo_and_written_configs_warn_nothing(tmp_path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", IgnoredKeyWarning)
        result = run_in_process("train", "--print-config", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        # What --print-config (and a run's config.yaml) holds names every key; read back,
        # keys left at their default are not choices.
        (tmp_path / "written.yaml").write_text(result.stdout)
        again = run_in_process("train", "written.yaml", "--print-config", cwd=tmp_path)
    assert again.returncode == 0, again.stderr


# --- small data ---------------------------------------------------------------------------

def regression_run(tmp_path: Path, rows: int, *overrides: str):
    data = write_regression_data(tmp_path / f"rows{rows}.npz", rows=rows)
    config = write_config(tmp_path / "run.yaml", {
        "model": {"factory": "factories:regressor", "task": "custom"},
        "data": {"path": str(data), "format": "tensors", "eval_fraction": 0},
        "train": {"output_dir": str(tmp_path / "out")},
        "log": {"progress": False, "tensorboard": False, "memory_every": 1000}})
    result = run_in_process("train", str(config), *overrides, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in
            (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]


def test_fewer_rows_than_a_micro_batch_is_warned_once(tmp_path: Path):
    with pytest.warns(UserWarning) as caught:
        records = regression_run(tmp_path, 3, "train.micro_batch_size=4", "train.epochs=4")
    small = [str(w.message) for w in caught if "fewer than one micro-batch" in str(w.message)]
    assert len(small) == 1
    assert "3 examples, fewer than one micro-batch of 4" in small[0]
    assert "repeats examples, drawn from a fresh shuffle each pass" in small[0]
    assert "3 optimizer steps make 4 passes" in small[0]
    assert records[-1]["epoch"] == pytest.approx(4.0)


@pytest.mark.parametrize("rows, epochs", [(10, 1.0), (10, 2.0), (3, 1.0), (40, 0.5)])
def test_epochs_count_real_passes(tmp_path: Path, rows: int, epochs: float):
    micro_batch, accumulation = 4, 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3 rows: the small-data warning is the test above's
        records = regression_run(tmp_path, rows, f"train.micro_batch_size={micro_batch}",
                                 f"train.gradient_accumulation_steps={accumulation}",
                                 f"train.epochs={epochs}")
    per_step = micro_batch * accumulation
    # Whole steps come as close to `epochs` passes as they can: within half a step's
    # examples, unless one step is already more than the whole run.
    allowed = max(per_step / 2, per_step - epochs * rows) / rows
    assert math.isclose(records[-1]["epoch"], len(records) * per_step / rows)
    assert abs(records[-1]["epoch"] - epochs) <= allowed + 1e-9
