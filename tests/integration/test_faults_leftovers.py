"""The last tracebacks of the second hostile-user probe, each now one line (or working): a
pickled .bin base, ``memfit env --debug``, a resume asked to stop before its checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
from cli_helpers import (
    assert_one_line_error,
    run_in_process,
    tree_digest,
    write_config,
    write_instructions,
)
from factories import write_regression_data


class _RunsCode:
    """An object whose unpickling would call print: what a hostile .bin holds."""

    def __reduce__(self):
        return (print, ("this ran",))


def test_a_bin_base_holding_python_objects_is_one_line(tmp_path: Path):
    from transformers import LlamaConfig

    folder = tmp_path / "base"
    LlamaConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1).save_pretrained(folder)
    torch.save({"model.embed_tokens.weight": _RunsCode()}, folder / "pytorch_model.bin")
    config = write_config(tmp_path / "run.yaml", {
        "model": {"path": str(folder)},
        "data": {"path": str(write_instructions(tmp_path / "rows.jsonl", rows=8)),
                 "format": "instruction", "max_length": 32},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 1},
        "log": {"progress": False, "tensorboard": False}})
    result = run_in_process("train", str(config), cwd=tmp_path)
    assert_one_line_error(result, 2, f"model.path={folder}", "never unpickles")
    assert "this ran" not in result.stdout and not (tmp_path / "run").exists()


def test_env_takes_debug_like_every_command(tmp_path: Path):
    result = run_in_process("env", "--debug", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "torch" in result.stdout


def test_resume_with_max_steps_below_the_checkpoint_is_one_line(tmp_path: Path):
    data = write_regression_data(tmp_path / "regression.npz")
    config = write_config(tmp_path / "run.yaml", {
        "model": {"factory": "factories:regressor", "task": "custom"},
        "data": {"path": str(data), "format": "tensors", "eval_fraction": 0},
        "train": {"max_steps": 4, "micro_batch_size": 4, "save_every": 2,
                  "output_dir": str(tmp_path / "run")},
        "log": {"progress": False, "tensorboard": False}})
    assert run_in_process("train", str(config), cwd=tmp_path).returncode == 0
    before = tree_digest(tmp_path / "run")
    result = run_in_process("train", "--trust-code", "--resume", str(tmp_path / "run"),
                            "train.max_steps=3", cwd=tmp_path)
    assert_one_line_error(result, 2, "checkpoint is at step 4", "train.max_steps")
    assert tree_digest(tmp_path / "run") == before


def test_the_default_run_folder_in_an_unwritable_directory_is_one_line():
    result = run_in_process("train", "train.max_steps=1", cwd=Path("/proc"))
    assert_one_line_error(result, 2, "default run folder runs/", "train.output_dir")


def test_a_run_folder_inside_its_data_folder_is_refused(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    write_instructions(data / "rows.jsonl", rows=8)
    before = tree_digest(tmp_path)
    result = run_in_process("train", f"data.path={data}", "data.format=instruction",
                            f"train.output_dir={data / 'run'}", "train.max_steps=1",
                            cwd=tmp_path)
    assert_one_line_error(result, 2, f"train.output_dir={data / 'run'} is inside data.path")
    assert tree_digest(tmp_path) == before


def test_merge_of_another_tools_folder_is_refused(tmp_path: Path):
    """config.yaml and adapter/ alone do not make a memfit run: its marker does."""
    theirs = tmp_path / "theirs"
    (theirs / "adapter").mkdir(parents=True)
    (theirs / "config.yaml").write_text("model: {preset: tiny-llama}\n")
    (theirs / "adapter" / "adapter_config.json").write_text("{}")
    before = tree_digest(tmp_path)
    result = run_in_process("merge", str(theirs), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert_one_line_error(result, 2, "not a memfit run folder", "memfit-run.json")
    assert tree_digest(tmp_path) == before
