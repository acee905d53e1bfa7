"""A run folder someone else made is data: resuming or merging it never imports the code
its config.yaml names unless the user passes --trust-code, and a resume refuses a base
model whose files changed since the run started (an unchanged copy may be named)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run_in_process, tree_digest, write_config
from factories import write_regression_data

from memfit.checkpoint.state import BASE_FILE

# A factory file that leaves a mark each time it is imported: the test's proof that code
# named by a run folder ran (or did not).
FACTORY = """\
from pathlib import Path

Path(__file__).with_name("imported").write_text("yes")

from factories import regressor  # noqa: E402
"""


@pytest.fixture(scope="module")
def factory_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished LoRA run of a factory model named as 'file.py:function', two checkpoints."""
    root = tmp_path_factory.mktemp("shared")
    (root / "their_model.py").write_text(FACTORY)
    data = write_regression_data(root / "regression.npz")
    config = write_config(root / "run.yaml", {
        "model": {"factory": "their_model.py:regressor", "task": "custom"},
        "data": {"path": str(data), "format": "tensors", "eval_fraction": 0},
        "adapter": {"kind": "lora", "rank": 2, "targets": ["all-linear"]},
        "train": {"max_steps": 2, "micro_batch_size": 4, "save_every": 1,
                  "output_dir": str(root / "run")},
        "log": {"progress": False, "tensorboard": False}})
    result = run_in_process("train", str(config), cwd=root)  # my own config: no opt-in
    assert result.returncode == 0, result.stderr
    assert (root / "imported").read_text() == "yes"
    return root / "run"


def _fresh_copy(run: Path, tmp_path: Path) -> Path:
    (run.parent / "imported").unlink(missing_ok=True)
    return Path(shutil.copytree(run, tmp_path / "run"))


@pytest.mark.parametrize("command", ["resume", "merge"])
def test_code_named_by_a_run_folder_runs_only_with_trust_code(factory_run: Path,
                                                              tmp_path: Path, command: str):
    run = _fresh_copy(factory_run, tmp_path)
    before = tree_digest(run)
    arguments = (["train", "--resume", str(run), "train.max_steps=3"] if command == "resume"
                 else ["merge", str(run), "--out", str(tmp_path / "merged")])
    result = run_in_process(*arguments, cwd=tmp_path)
    assert_one_line_error(result, 2, "model.factory=", "their_model.py",
                          "--trust-code")
    assert not (factory_run.parent / "imported").exists()  # never imported
    assert tree_digest(run) == before and not (tmp_path / "merged").exists()

    trusted = run_in_process(*arguments[:1], "--trust-code", *arguments[1:], cwd=tmp_path)
    assert trusted.returncode == 0, trusted.stderr
    assert (factory_run.parent / "imported").exists()


def test_report_of_a_run_naming_code_imports_nothing(factory_run: Path, tmp_path: Path):
    run = _fresh_copy(factory_run, tmp_path)
    result = run_in_process("report", str(run), "--out", str(tmp_path / "report.html"),
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (factory_run.parent / "imported").exists()


# --- the same base ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of a Hugging Face folder (a tiny Llama) stopped at step 2 of 2, checkpointed."""
    from cli_helpers import write_instructions
    from transformers import LlamaConfig, LlamaForCausalLM

    from memfit.models.tokenizers import BYTE_VOCAB_SIZE

    root = tmp_path_factory.mktemp("base")
    LlamaForCausalLM(LlamaConfig(
        vocab_size=BYTE_VOCAB_SIZE, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )).save_pretrained(root / "base")
    config = write_config(root / "run.yaml", {
        "model": {"path": str(root / "base")},
        "data": {"path": str(write_instructions(root / "rows.jsonl", rows=16)),
                 "format": "instruction", "max_length": 64, "eval_fraction": 0},
        "adapter": {"kind": "lora", "rank": 2},
        "train": {"max_steps": 2, "save_every": 1, "output_dir": str(root / "run")},
        "log": {"progress": False, "tensorboard": False}})
    result = run_in_process("train", str(config), cwd=root)
    assert result.returncode == 0, result.stderr
    return root / "run"


def _altered_copy(base: Path, copy: Path) -> Path:
    """``base`` copied with one byte of its weights changed (same size)."""
    shutil.copytree(base, copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    return copy


def test_the_run_records_its_base(base_run: Path):
    import json

    recorded = json.loads((base_run / BASE_FILE).read_text())
    assert {"config.json", "model.safetensors"} <= recorded.keys()
    assert all(len(entry["sha256"]) == 64 for entry in recorded.values())
    assert (base_run / "checkpoints" / "step-2" / BASE_FILE).is_file()


def test_a_changed_base_is_refused_and_an_unchanged_copy_resumes(base_run: Path,
                                                                 tmp_path: Path):
    run = Path(shutil.copytree(base_run, tmp_path / "run"))
    base = base_run.parent / "base"
    before = tree_digest(run)

    altered = _altered_copy(base, tmp_path / "altered")
    result = run_in_process("train", "--resume", str(run), f"model.path={altered}",
                            "train.max_steps=3", cwd=tmp_path)
    assert_one_line_error(result, 2, "base model changed", "model.safetensors (contents)",
                          f"model.path={base}")
    assert tree_digest(run) == before

    moved = base.with_name("moved")
    base.rename(moved)
    try:
        result = run_in_process("train", "--resume", str(run), "train.max_steps=3",
                                cwd=tmp_path)
        assert_one_line_error(result, 2, f"model.path={base} no longer exists",
                              "unchanged copy")
        assert tree_digest(run) == before
        result = run_in_process("train", "--resume", str(run), f"model.path={moved}",
                                "train.max_steps=3", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"path: {moved}" in (run / "config.yaml").read_text()
    finally:
        moved.rename(base)


def test_a_base_changed_in_place_is_refused(base_run: Path, tmp_path: Path):
    run = Path(shutil.copytree(base_run, tmp_path / "run"))
    config_json = base_run.parent / "base" / "config.json"
    original = config_json.read_bytes()
    config_json.write_bytes(original.replace(b"\n", b"\n ", 1))
    try:
        result = run_in_process("train", "--resume", str(run), "train.max_steps=3",
                                cwd=tmp_path)
    finally:
        config_json.write_bytes(original)
    assert_one_line_error(result, 2, "base model changed", "config.json (size)")
