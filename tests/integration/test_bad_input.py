"""Bad input: one line naming the key/file/value, exit 2, no traceback, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli, run_in_process, tiny_run_arguments, write_config


def expect_clean_error(tmp_path: Path, arguments: list[str], *fragments: str) -> None:
    result = run_in_process("train", *arguments, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("memfit: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_malformed_yaml(tmp_path: Path):
    (tmp_path / "bad.yaml").write_text("model: {preset: tiny-llama\n")
    expect_clean_error(tmp_path, ["bad.yaml"], "bad.yaml", "not valid YAML")


def test_unknown_key_suggests(tmp_path: Path, instructions: Path):
    expect_clean_error(tmp_path, tiny_run_arguments(instructions, tmp_path / "out",
                                                    "train.max_step=3"),
                       "train.max_step", "did you mean train.max_steps")


def test_wrong_type(tmp_path: Path, instructions: Path):
    expect_clean_error(tmp_path, tiny_run_arguments(instructions, tmp_path / "out",
                                                    "train.micro_batch_size=big"),
                       "train.micro_batch_size", "whole number")


def test_missing_data_file(tmp_path: Path):
    expect_clean_error(tmp_path, tiny_run_arguments(tmp_path / "nope.jsonl", tmp_path / "out"),
                       "nope.jsonl")


def test_empty_data_file(tmp_path: Path):
    (tmp_path / "empty.jsonl").write_text("")
    expect_clean_error(tmp_path, tiny_run_arguments(tmp_path / "empty.jsonl", tmp_path / "out"),
                       "empty.jsonl")


def test_row_without_required_fields(tmp_path: Path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "a", "response": "b"}) + "\n"
                    + json.dumps({"question": "a"}) + "\n")
    expect_clean_error(tmp_path, tiny_run_arguments(rows, tmp_path / "out"), "rows.jsonl",
                       "response")


def test_all_labels_masked(tmp_path: Path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": "x" * 200, "response": "y"}) + "\n"
                            for _ in range(4)))
    expect_clean_error(tmp_path, tiny_run_arguments(rows, tmp_path / "out",
                                                    "data.eval_fraction=0"),
                       "data.max_length")


def test_a_hub_id_as_model_path_says_how_to_make_the_folder(tmp_path: Path,
                                                           instructions: Path):
    arguments = tiny_run_arguments(instructions, tmp_path / "out", "model.preset=null",
                                   "model.path=HuggingFaceTB/SmolLM2-135M")
    expect_clean_error(tmp_path, arguments, "models are local folders",
                       "huggingface-cli download HuggingFaceTB/SmolLM2-135M --local-dir DIR",
                       "snapshot_download")


@pytest.mark.parametrize("factory, fragment", [
    ("no_such_package.models:build", "cannot import 'no_such_package.models'"),
    ("json:no_such_function", "has no 'no_such_function'"),
])
def test_factory_that_cannot_be_imported(tmp_path: Path, factory: str, fragment: str):
    (tmp_path / "t.npz").write_bytes(b"")
    config = write_config(tmp_path / "factory.yaml", {
        "model": {"factory": factory, "task": "custom"},
        "data": {"path": str(tmp_path / "t.npz"), "format": "tensors"},
        "train": {"output_dir": str(tmp_path / "out")}})
    expect_clean_error(tmp_path, [str(config)], "model.factory", fragment)


def test_debug_shows_the_traceback(tmp_path: Path, instructions: Path):
    # A process of its own: the traceback is what the interpreter prints as it ends.
    result = run_cli("train", "--debug",
                     *tiny_run_arguments(instructions, tmp_path / "out", "train.max_step=3"),
                     cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" in result.stderr
