"""`memfit merge` on a run folder someone else made: an adapter it cannot merge faithfully
(non-finite values, keys or shapes that do not fit the base, settings that change what
merging means, damaged files) and an --out it must not write (the run's own base or data,
a link, a folder another merge is writing) are refused in one line, exit 2, before anything
is written: no --out folder, no staging folder, no lock file."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml
from cli_helpers import (
    assert_one_line_error,
    run_in_process,
    tiny_run_arguments,
    tree_digest,
    write_instructions,
)
from safetensors.torch import load_file, save_file

from memfit._utils.errors import ConfigError, MemfitError
from memfit.checkpoint.adapter_checks import check_tensors_fit
from memfit.config import Config
from memfit.config.load import read_yaml
from memfit.merge import claim_path, merge_run

WEIGHTS, CONFIG = "adapter/adapter_model.safetensors", "adapter/adapter_config.json"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished LoRA run of the tiny Llama preset (rank 2 on every linear layer), trained
    once; each test tampers with a copy."""
    folder = tmp_path_factory.mktemp("trained")
    data = write_instructions(folder / "rows.jsonl", rows=16)
    arguments = tiny_run_arguments(data, folder / "run", "train.max_steps=2", "adapter.rank=2",
                                   "adapter.kind=lora", "log.tensorboard=false",
                                   "data.eval_fraction=0")
    result = run_in_process("train", *arguments, cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder / "run"


@pytest.fixture
def run(tmp_path: Path, trained: Path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "run"))


def merge(run: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return run_in_process("merge", str(run), "--out", str(out), *flags, cwd=run.parent)


def assert_refused(run: Path, *fragments: str, out: Path | None = None,
                   flags: tuple[str, ...] = ()) -> str:
    """The merge is one line naming ``fragments``, and everything beside the run is as it
    was: no --out, no staging folder, no lock file."""
    out = out or run.parent / "merged"
    before = tree_digest(run.parent)
    line = assert_one_line_error(merge(run, out, *flags), 2, *fragments)
    assert tree_digest(run.parent) == before
    return line


def rewrite_weights(run: Path, change) -> None:
    path = run / WEIGHTS
    weights = load_file(path)
    change(weights)
    save_file(weights, path, metadata={"format": "pt"})


def rewrite_config(run: Path, **fields) -> None:
    path = run / CONFIG
    config = json.loads(path.read_text())
    config.update(fields)
    path.write_text(json.dumps(config))


def a_key(run: Path, part: str = "lora_B") -> str:
    return next(key for key in sorted(load_file(run / WEIGHTS)) if part in key)


# --- 1. non-finite values ----------------------------------------------------------------

@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_adapter_values_are_refused(run: Path, value: float):
    key = a_key(run)
    rewrite_weights(run, lambda weights: weights[key].view(-1).__setitem__(0, value))
    assert_refused(run, WEIGHTS, key, "nan" if value != value else "inf")


def test_an_update_that_overflows_the_weights_is_refused(run: Path):
    """Finite in the file, but not once scaled and added to the base."""
    key = a_key(run)
    rewrite_weights(run, lambda weights: weights[key].fill_(1e30))
    rewrite_config(run, lora_alpha=1e30)
    assert_refused(run, "the merged model.", "nan or inf")


def test_non_finite_buffers_are_refused(run: Path):
    save_file({"model.norm.weight": torch.tensor([1.0, float("nan")])},
              run / "adapter/buffers.safetensors")
    assert_refused(run, "adapter/buffers.safetensors", "model.norm.weight", "nan")


# --- 2. keys and shapes that do not fit the base -----------------------------------------

def test_a_renamed_key_is_refused_not_dropped(run: Path):
    key = a_key(run)
    renamed = key.replace("layers.1.", "layers.7.").replace("layers.0.", "layers.7.")
    rewrite_weights(run, lambda weights: weights.__setitem__(renamed, weights.pop(key)))
    assert_refused(run, WEIGHTS, "match nothing", repr(renamed))


def test_an_adapter_of_another_model_is_refused(run: Path):
    rewrite_weights(run, lambda weights: [
        weights.__setitem__(key.replace("model.layers", "transformer.h"), weights.pop(key))
        for key in list(weights)])
    assert_refused(run, WEIGHTS, "match nothing", "transformer.h")


def test_a_partial_adapter_is_refused(run: Path):
    """A careful user expects every module the adapter config targets to be merged: a
    missing tensor would leave that module silently untrained."""
    key = a_key(run)
    rewrite_weights(run, lambda weights: weights.pop(key))
    assert_refused(run, WEIGHTS, "missing", repr(key), "partial")


@pytest.mark.parametrize("wrong", ["rank", "features"])
def test_a_tensor_of_the_wrong_shape_is_refused(run: Path, wrong: str):
    key = a_key(run, "lora_A")
    rank, features = load_file(run / WEIGHTS)[key].shape
    shape = (rank + 1, features) if wrong == "rank" else (rank, features + 1)
    rewrite_weights(run, lambda weights: weights.__setitem__(key, torch.zeros(shape)))
    assert_refused(run, WEIGHTS, repr(key), f"shape {shape}")


def test_an_adapter_without_lora_weights_is_refused(run: Path):
    save_file({}, run / WEIGHTS)
    assert_refused(run, WEIGHTS, "no LoRA weights")


def test_a_forged_rank_is_refused_before_peft_allocates_it(run: Path):
    rewrite_config(run, r=10**9)
    assert_refused(run, WEIGHTS, "r=1000000000")


def test_target_modules_naming_a_module_the_base_lacks_is_refused(run: Path):
    config = json.loads((run / CONFIG).read_text())
    assert "up_proj" in config["target_modules"]  # the list PEFT users write, leaf names
    extra = "model.layers.9.mlp.up_proj"
    rewrite_config(run, target_modules=[*config["target_modules"], extra])
    assert_refused(run, CONFIG, "target_modules", repr(extra), "no module of the base")
    # An anchored alternation of exact names (what memfit wrote before) is read too.
    names = [r"model\.layers\.0\.mlp\.up_proj", r"model\.layers\.9\.mlp\.up_proj"]
    rewrite_config(run, target_modules="^(?:" + "|".join(names) + ")$")
    assert_refused(run, CONFIG, "target_modules", repr(extra), "no module of the base")


def test_target_modules_of_a_kind_peft_cannot_adapt_is_refused(run: Path):
    rewrite_config(run, target_modules=["norm"])  # model.norm, an RMSNorm
    assert_refused(run, CONFIG, "PEFT cannot apply it")


@pytest.mark.parametrize(("field", "value"), [
    ("target_modules", "^(?:(a+)+b)$"), ("target_modules", ".*proj"),
    ("modules_to_save", ["(a+)+b"])])
def test_patterns_other_than_module_names_are_refused(run: Path, field: str, value):
    """PEFT matches them against every module name: a crafted one could run for hours."""
    rewrite_config(run, **{field: value})
    assert_refused(run, CONFIG, f"{field}=")


def test_an_adapter_folder_linking_out_of_the_run_is_refused(run: Path, tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    (run / "adapter").rename(elsewhere)
    (run / "adapter").symlink_to(elsewhere)
    assert_refused(run, "outside the run folder")


# --- 3. adapter settings merge does not reproduce ----------------------------------------

@pytest.mark.parametrize(("field", "value"), [
    ("init_lora_weights", "pissa"), ("init_lora_weights", "olora"),
    ("init_lora_weights", "corda"), ("init_lora_weights", "eva"),
    ("init_lora_weights", "loftq"), ("loftq_config", {"loftq_bits": 4}),
    ("peft_type", "LOHA"), ("rank_pattern", {"q_proj": 4}), ("alpha_pattern", {"q_proj": 4}),
    ("layer_replication", [[0, 2], [1, 2]]), ("bias", "all"), ("fan_in_fan_out", True),
    ("lora_bias", True), ("exclude_modules", ["q_proj"]), ("task_type", "TOKEN_CLS"),
    ("lora_alpha", float("nan")), ("r", "2"), ("a_setting_from_the_future", 3),
])
def test_settings_merge_cannot_reproduce_are_refused(run: Path, field: str, value):
    rewrite_config(run, **{field: value})
    assert_refused(run, CONFIG, f"{field}=")


def test_a_config_without_lora_alpha_is_refused(run: Path):
    config = json.loads((run / CONFIG).read_text())
    del config["lora_alpha"]
    (run / CONFIG).write_text(json.dumps(config))
    assert_refused(run, CONFIG, "no lora_alpha field")


def test_settings_that_do_not_change_the_merge_are_accepted(run: Path, tmp_path: Path):
    """Where the adapter says it came from, and empty fields of another PEFT version."""
    assert merge(run, tmp_path / "plain").returncode == 0
    rewrite_config(run, base_model_name_or_path="someone/elsewhere", revision="main",
                   a_setting_from_the_future=None, peft_version="0.99.0")
    result = merge(run, tmp_path / "changed")
    assert result.returncode == 0, result.stderr
    assert load_file(tmp_path / "changed/model.safetensors").keys() == \
        load_file(tmp_path / "plain/model.safetensors").keys()
    for name, tensor in load_file(tmp_path / "changed/model.safetensors").items():
        assert torch.equal(tensor, load_file(tmp_path / "plain/model.safetensors")[name]), name


# --- 4. damaged files --------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["empty", "truncated", "header", "not-json"])
def test_a_damaged_safetensors_file_is_refused(run: Path, damage: str):
    path = run / WEIGHTS
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "truncated": data[:-64], "header": b"\xff" * 64,
                      "not-json": (4).to_bytes(8, "little") + b"abcd"}[damage])
    assert_refused(run, WEIGHTS, "not a readable safetensors file")


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "not a readable JSON file"), ("{not json", "not a readable JSON file"),
    ("[1, 2]", "not a JSON object"), ("null", "not a JSON object"),
    ("\"LORA\"", "not a JSON object"),
    pytest.param("[" * 100_000, "not a readable JSON file", id="nested-too-deep")])
def test_a_damaged_adapter_config_is_refused(run: Path, text: str, fragment: str):
    (run / CONFIG).write_text(text)
    assert_refused(run, CONFIG, fragment)


def test_a_tensor_of_a_wrong_dtype_is_refused(run: Path):
    key = a_key(run)
    rewrite_weights(run, lambda weights: weights.__setitem__(key, weights[key].to(torch.int64)))
    assert_refused(run, WEIGHTS, repr(key), "torch.int64")


def test_a_buffer_of_the_wrong_kind_of_dtype_is_refused(tmp_path: Path):
    """BatchNorm's step counter is an integer; a float there (or an integer statistic)
    is not what training left."""
    counter, statistic = "bn.num_batches_tracked", "bn.running_mean"
    expected = {counter: torch.tensor(3), statistic: torch.zeros(4)}
    path = tmp_path / "buffers.safetensors"
    for saved, wrong in (({counter: torch.tensor(3.0)}, "torch.float32"),
                         ({statistic: torch.zeros(4, dtype=torch.int32)}, "torch.int32")):
        with pytest.raises(ConfigError, match=f"{next(iter(saved))}.* holds {wrong}"):
            check_tensors_fit(path, saved, expected, "the merged model's buffers",
                              complete=False)
    check_tensors_fit(path, {statistic: torch.zeros(4, dtype=torch.float16)}, expected,
                      "the merged model's buffers", complete=False)


# --- 5. --out on what the run reads ------------------------------------------------------

def set_run_config(run: Path, section: str, **values) -> None:
    config = read_yaml(run / "config.yaml")
    config[section].update(values)
    (run / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def model_folder(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face folder of the tiny Llama (the trained run, merged), to serve as a
    run's model.path."""
    out = tmp_path_factory.mktemp("model") / "base"
    assert merge(trained, out).returncode == 0
    return out


@pytest.mark.parametrize("where", ["equal", "containing", "inside"])
def test_out_on_the_runs_base_model_is_refused_even_with_force(run: Path, tmp_path: Path,
                                                               model_folder: Path, where: str):
    """Replacing it would make a later --resume train on the merged weights."""
    base = Path(shutil.copytree(model_folder, tmp_path / "models" / "base"))
    set_run_config(run, "model", path=str(base), preset=None)
    out = {"equal": base, "containing": base.parent, "inside": base / "merged"}[where]
    assert_refused(run, "model.path", out=out, flags=("--force",))


@pytest.mark.parametrize("key", ["path", "eval_path"])
def test_out_on_the_runs_data_is_refused_even_with_force(run: Path, tmp_path: Path, key: str):
    data = tmp_path / "data"
    data.mkdir()
    write_instructions(data / "rows.jsonl", rows=4)
    values = ({"eval_path": str(data), "eval_fraction": Config().data.eval_fraction}
              if key == "eval_path" else {"path": str(data / "rows.jsonl")})
    set_run_config(run, "data", **values)  # (an eval_path leaves eval_fraction unset)
    assert_refused(run, f"data.{key}", out=data, flags=("--force",))


# --- 6. two merges into one --out --------------------------------------------------------

def test_two_merges_into_one_folder_at_once_one_wins(run: Path, tmp_path: Path):
    """Two threads stand in for two processes (each claim is its own open file, so the
    lock excludes them just the same) without two interpreter start-ups. Whichever way
    they interleave, one writes and the other is refused: by the claim while the first
    writes, or as a folder that is no longer empty once it has."""
    out, start = tmp_path / "merged", threading.Barrier(2)

    def merge_at_once() -> str:
        start.wait()
        try:
            merge_run(run, out)
        except MemfitError as error:
            return str(error)
        return "merged"

    with ThreadPoolExecutor(2) as pool:
        results = sorted(pool.map(lambda _: merge_at_once(), range(2)))
    assert results[1] == "merged" and results[0] != "merged", results
    assert f"--out {out}" in results[0] and "\n" not in results[0]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["merged", "run"]
    assert load_file(out / "model.safetensors")


def test_a_merge_refuses_a_folder_another_merge_is_writing(run: Path, tmp_path: Path):
    out = tmp_path / "merged"
    holder = os.open(claim_path(out), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        before = tree_digest(tmp_path)
        assert_one_line_error(merge(run, out), 2, "another memfit merge")
        assert tree_digest(tmp_path) == before
    finally:
        os.close(holder)
    # A claim file a killed merge left behind blocks nobody, and is removed.
    assert merge(run, out).returncode == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["merged", "run"]


def test_a_link_at_the_lock_name_is_never_written_through(run: Path, tmp_path: Path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    claim_path(tmp_path / "merged").symlink_to(victim)
    assert_refused(run, "lock file")
    assert victim.read_text() == "mine"


def test_the_claim_of_a_long_out_name_is_a_valid_file_name(tmp_path: Path):
    claim = claim_path(tmp_path / ("é" * 125))  # 250 bytes: the longest a name may be, nearly
    assert len(os.fsencode(claim.name)) <= 255 and claim.parent == tmp_path
    os.close(os.open(claim, os.O_CREAT | os.O_WRONLY))


# --- 7. --out that is a link -------------------------------------------------------------

@pytest.mark.parametrize("target", ["folder", "dangling"])
@pytest.mark.parametrize("force", [False, True])
def test_out_that_is_a_symlink_is_refused(run: Path, tmp_path: Path, target: str, force: bool):
    real = tmp_path / "real"
    if target == "folder":
        real.mkdir()
        (real / "keep.txt").write_text("mine")
    link = tmp_path / "link"
    link.symlink_to(real)
    before = sorted(path.name for path in tmp_path.iterdir())
    result = merge(run, link, *(("--force",) if force else ()))
    assert_one_line_error(result, 2, f"--out {link}", "symbolic link")
    assert sorted(path.name for path in tmp_path.iterdir()) == before
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert ([path.name for path in real.iterdir()] == ["keep.txt"] if target == "folder"
            else not real.exists())
