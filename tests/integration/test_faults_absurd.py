"""Absurd input is bounded (issue 23, item 6, and item 8's "#" and line-break cases): a YAML
alias bomb, a size or count no machine could hold, a chat template that loops or recurses
without end, 10**12 classes: one line naming the key and the limit, exit status 2, at once,
and nothing written.

Cases that hung before run in ONE fresh interpreter (cli_helpers.run_cli_cases: one start-up
for all of them) whose timeout only guards the test run against such a hang (subprocess.run
kills it); the others run in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_helpers import (
    assert_one_line_error,
    run_cli_cases,
    run_in_process,
    tiny_run_arguments,
    tree_digest,
    write_config,
    write_instructions,
)
from test_faults_input import refused

from memfit._utils.errors import DataError
from memfit.config.limits import MAX_CLASSES, MAX_DEVICES, MAX_TEMPLATE_RANGE, MAX_YAML_NODES
from memfit.data.classification import found_labels
from memfit.data.read import Row

pytestmark = pytest.mark.usefixtures("quiet_transformers")

HANG_GUARD_SECONDS = 300  # far beyond the few seconds a refusal takes: only a hang reaches it


# --- what hung before: in a subprocess -----------------------------------------------------

def alias_bomb() -> str:
    """A config whose optimizer.kwargs is "billion laughs": nine aliases of nine aliases ...
    of a list, 9**9 values once expanded."""
    lines = ['    l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 9):
        lines.append(f"    l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]")
    return ("model: {preset: tiny-llama}\ndata: {path: rows.jsonl}\noptimizer:\n  kwargs:\n"
            + "\n".join(lines) + "\n")


def resume_folder(tmp_path: Path) -> list[str]:
    """A downloaded "run folder" whose config.yaml is an alias bomb."""
    run = tmp_path / "downloaded-run"
    run.mkdir()
    (run / "config.yaml").write_text(alias_bomb())
    return ["train", "--resume", str(run)]


def bomb_file(tmp_path: Path) -> list[str]:
    (tmp_path / "bomb.yaml").write_text(alias_bomb())
    return ["train", "bomb.yaml"]


def tiny_run_with(*overrides: str):
    """``memfit train`` of the tiny preset on instruction rows, with ``overrides``."""
    def arguments(tmp_path: Path) -> list[str]:
        data = write_instructions(tmp_path / "rows.jsonl")
        return ["train", *tiny_run_arguments(data, tmp_path / "out", *overrides)]
    return arguments


def plan_with(*overrides: str):
    return lambda tmp_path: ["plan", "model.preset=tiny-llama", "--budget", "24GiB", *overrides]


# id -> (the case's arguments, given its folder; fragments of its one line)
HUNG = {
    "alias-bomb": (bomb_file, ("bomb.yaml is refused", f"{MAX_YAML_NODES:,} values")),
    "alias-bomb-in-a-run-folder": (resume_folder,
                                   ("config.yaml is refused", f"{MAX_YAML_NODES:,} values")),
    "micro-batch-1e23": (
        tiny_run_with("train.micro_batch_size=100000000000000000000000"),
        ("train.micro_batch_size=100000000000000000000000 is beyond memfit's limit of "
         "1,048,576",)),
    "max-steps": (
        tiny_run_with("train.max_steps=10000000000000000000000"),
        ("train.max_steps=10000000000000000000000 is beyond memfit's limit of 1,000,000,000",)),
    "accumulation": (tiny_run_with("train.gradient_accumulation_steps=99999999999"),
                     ("train.gradient_accumulation_steps=99999999999 is beyond",)),
    "epochs": (tiny_run_with("train.epochs=1e300"),
               ("train.epochs=1e+300 is beyond memfit's limit of 1,000,000",)),
    "lora-rank": (tiny_run_with("adapter.kind=lora", "adapter.rank=99999999999"),
                  ("adapter.rank=99999999999 is beyond memfit's limit of 65,536",)),
    "plan-micro-batch": (plan_with("train.micro_batch_size=99999999999"),
                         ("train.micro_batch_size=99999999999 is beyond",)),
}


@pytest.fixture(scope="module")
def hung_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """id -> (the run's result, its folder, that folder's digest before the run): every case
    of HUNG in a folder of its own, all in one fresh interpreter."""
    folders = {name: tmp_path_factory.mktemp(name) for name in HUNG}
    commands = {name: arguments(folders[name]) for name, (arguments, _) in HUNG.items()}
    before = {name: tree_digest(folder) for name, folder in folders.items()}
    results = run_cli_cases([(commands[name], folders[name]) for name in HUNG],
                            tmp_path_factory.mktemp("hung-cases"), timeout=HANG_GUARD_SECONDS)
    return {name: (result, folders[name], before[name])
            for name, result in zip(HUNG, results, strict=True)}


@pytest.mark.parametrize("name", list(HUNG))
def test_what_hung_is_refused_at_once(hung_cases, name: str):
    result, folder, before = hung_cases[name]
    assert_one_line_error(result, 2, *HUNG[name][1])
    assert tree_digest(folder) == before


# --- sizes and counts ----------------------------------------------------------------------

# Each failed at once before too, with a traceback or a run of the wrong length; what ran
# without end is above (and every key's limit in tests/unit/config/test_limits.py).
@pytest.mark.parametrize("overrides, fragments", [
    (["train.seed=18446744073709551616"], ("train.seed=18446744073709551616 is beyond",
                                            "limit of 4,294,967,295")),
    (["train.seed=-1"], ("train.seed must be 0 or more, got -1",)),
    (["memory.budget=1e400GiB"], ("memory.budget: '1e400GiB' is not a finite size",)),
    (["memory.budget=0"], ("memory.budget must be above 0 bytes",)),
    (["train.save_every=99999999999999"], ("train.save_every=99999999999999 is beyond",)),
    (["optimizer.lr=nan"], ("optimizer.lr must be above 0 and finite",)),
    (["optimizer.lr=inf"], ("optimizer.lr must be above 0 and finite",)),
], ids=lambda value: "-".join(value) if isinstance(value, list) else None)
def test_sizes_and_counts_beyond_any_machine_are_one_line(tmp_path: Path, instructions: Path,
                                                         overrides, fragments):
    refused(tmp_path, tiny_run_arguments(instructions, tmp_path / "out", *overrides), *fragments)


@pytest.mark.parametrize("arguments, fragments", [
    (["--budget", "1e400GiB"], ("--budget: '1e400GiB' is not a finite size",)),
    (["--budget", "2000000TiB"], ("--budget=2000000TiB is beyond memfit's limit",)),
    (["--budget", "0"], ("--budget must be above 0 bytes",)),
    (["--budget", "24GiB", "--devices", "100000"],
     (f"--devices=100000 is beyond memfit's limit of {MAX_DEVICES:,}",)),
    (["--budget", "24GiB", "--devices", "-3"], ("--devices must be at least 1, got -3",)),
], ids=["inf", "over-1EiB", "zero", "devices-100000", "devices-negative"])
def test_plan_refuses_absurd_budgets_and_devices(tmp_path: Path, arguments, fragments):
    refused(tmp_path, ["model.preset=tiny-llama", *arguments], *fragments, command="plan")


def test_plan_over_more_devices_than_a_weight_has_rows(tmp_path: Path):
    """64 devices and tiny-llama's 32-row weights: some devices hold no rows of them (their
    optimizer state was costed on a 0-row shard: ZeroDivisionError)."""
    result = run_in_process("plan", "model.preset=tiny-llama", "--budget", "24GiB",
                            "--devices", "64", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["devices"] == 64


# --- "#" and line breaks in override values ------------------------------------------------

def test_a_hash_in_an_override_value_is_kept(tmp_path: Path, instructions: Path):
    data = tmp_path / "my#rows #1.jsonl"
    data.write_bytes(instructions.read_bytes())
    result = run_in_process("train", *tiny_run_arguments(instructions, tmp_path / "out"),
                            f"data.path={data.name}", "train.output_dir=runs/a #1",
                            "--print-config", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["data"]["path"] == str(data)
    assert printed["train"]["output_dir"] == "runs/a #1"


def test_a_comment_after_a_number_is_refused(tmp_path: Path, instructions: Path):
    refused(tmp_path, tiny_run_arguments(instructions, tmp_path / "out",
                                         "train.max_steps=10 # a test"),
            "override 'train.max_steps=10 # a test'", "'# a test' as a comment")


def test_a_line_break_in_a_path_key_is_refused(tmp_path: Path, instructions: Path):
    refused(tmp_path, tiny_run_arguments(instructions, tmp_path / "out",
                                         f"train.output_dir={tmp_path}/run\nb"),
            "train.output_dir=", "\\nb'", "holds a control character")


# --- chat templates ------------------------------------------------------------------------

_MESSAGES = ("{% for message in messages %}{{ message.role }}: {{ message.content }}\n"
             "{% endfor %}")


def chat_arguments(tmp_path: Path, template: str) -> list[str]:
    """A tiny Llama folder whose tokenizer has ``template``, chat rows, and a config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from memfit.models.tokenizers import BYTE_VOCAB_SIZE, byte_level_tokenizer

    folder = tmp_path / "model"
    LlamaForCausalLM(LlamaConfig(
        vocab_size=BYTE_VOCAB_SIZE, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )).save_pretrained(folder)
    tokenizer = byte_level_tokenizer()
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    rows = tmp_path / "chats.jsonl"
    rows.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"say {index}"},
        {"role": "assistant", "content": f"{index}"}]}) + "\n" for index in range(8)))
    config = write_config(tmp_path / "run.yaml", {
        "model": {"path": str(folder)},
        "data": {"path": str(rows), "format": "chat", "max_length": 32},
        "train": {"output_dir": str(tmp_path / "out"), "max_steps": 1},
        "log": {"progress": False, "tensorboard": False}})
    return [str(config)]


@pytest.mark.parametrize("template, fragments", [
    # Two loops of 60,000: each within Jinja's own cap of 100,000 per range, together past
    # memfit's budget per rendering (nested loops of 99,999 would take hours).
    ("{% for i in range(60000) %}{% endfor %}{% for i in range(60000) %}{% endfor %}"
     + _MESSAGES, (f"loop more than memfit's limit of {MAX_TEMPLATE_RANGE:,}",
                   "range(60000)")),
    ("{% for i in range(10**12) %}x{% endfor %}", ("range(1000000000000)",)),
    ("{% macro turn(m) %}{{ turn(m) }}{% endmacro %}{% for m in messages %}{{ turn(m) }}"
     "{% endfor %}", ("recurses without end",)),
], ids=["ranges", "huge-range", "recursion"])
def test_a_chat_template_that_loops_or_recurses_is_one_line(tmp_path: Path, template: str,
                                                           fragments):
    arguments = chat_arguments(tmp_path, template)
    before = tree_digest(tmp_path)
    result = run_in_process("train", *arguments, cwd=tmp_path)
    assert_one_line_error(result, 2, "chats.jsonl row 1", "chat template", *fragments)
    assert tree_digest(tmp_path) == before


# --- classification labels -----------------------------------------------------------------

def rows_with(*labels: object) -> list[list[Row]]:
    return [[Row(f"train.jsonl row {number}", {"text": "a review", "label": label})
             for number, label in enumerate(labels, start=1)]]


def test_an_integer_label_beyond_the_class_limit_is_refused():
    """999999999999 as a class id would make 10**12 classes (their names were built)."""
    with pytest.raises(DataError, match=f"row 2: label 999999999999 is a class id beyond "
                                        f"memfit's limit of {MAX_CLASSES:,} classes"):
        found_labels(rows_with(0, 999_999_999_999), "label")
    assert found_labels(rows_with(0, MAX_CLASSES - 1), "label").names[-1] == str(MAX_CLASSES - 1)


def test_an_empty_label_is_refused_before_training(tmp_path: Path):
    """A run whose classes include "" trained, then merge and resume refused it forever."""
    from tiny_bert import write_jsonl, write_tiny_bert

    write_tiny_bert(tmp_path / "base")
    write_jsonl(tmp_path / "train.jsonl", [{"text": "great film", "label": "positive"},
                                           {"text": "awful", "label": ""}])
    config = write_config(tmp_path / "run.yaml", {
        "model": {"path": str(tmp_path / "base"), "task": "sequence-classification"},
        "data": {"path": str(tmp_path / "train.jsonl"), "format": "classification",
                 "eval_fraction": 0, "max_length": 32},
        "train": {"output_dir": str(tmp_path / "run")}, "log": {"progress": False}})
    refused(tmp_path, [str(config)], "train.jsonl row 2", "is an empty string")
