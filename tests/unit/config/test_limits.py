"""Absurd input is refused in one line naming the key, the value and the limit (issue 23,
items 6 and 8): YAML alias bombs and deep nesting, sizes and counts no machine could hold,
override values that YAML would cut at a ``#`` or fold at a line break."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from memfit._utils.errors import ConfigError
from memfit._utils.sizes import parse_bytes
from memfit.config.limits import (
    MAX_CONFIG_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    check_int_limits,
    int_limits,
)
from memfit.config.load import parse_overrides, read_yaml
from memfit.config.schema import Config
from memfit.techniques.config_checks import from_mapping

INT_LIMITS = int_limits(Config)  # every whole-number key's bounds, from schema.py

MINIMAL = {"model": {"preset": "tiny-llama"}, "data": {"path": "rows.jsonl"}}


def with_key(key: str, value: object) -> dict:
    """MINIMAL with the dotted ``key`` set to ``value``."""
    raw = {section: dict(values) for section, values in MINIMAL.items()}
    *parents, leaf = key.split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return raw


def alias_bomb() -> str:
    """"Billion laughs": a list of ten values, then lists of ten aliases of the one before:
    10**8 values once expanded, in a few hundred characters."""
    return "[&a [x, x, x, x, x, x, x, x, x, x]" + "".join(
        f", &{name} [{', '.join([f'*{before}'] * 10)}]"
        for before, name in zip("abcdefg", "bcdefgh", strict=True)) + "]"


# --- YAML: config files and override values -----------------------------------------------

def test_an_alias_bomb_in_a_config_file_is_refused(tmp_path: Path):
    path = tmp_path / "bomb.yaml"
    path.write_text(f"optimizer: {{kwargs: {{bomb: {alias_bomb()}}}}}\n")
    with pytest.raises(ConfigError, match=f"bomb.yaml is refused: .*{MAX_YAML_NODES:,} values"):
        read_yaml(path)


def test_an_alias_bomb_in_an_override_is_refused():
    with pytest.raises(ConfigError, match=f"optimizer.kwargs.*refused.*{MAX_YAML_NODES:,}"):
        parse_overrides([f"optimizer.kwargs={{bomb: {alias_bomb()}}}"])


def test_an_alias_inside_its_own_value_is_refused(tmp_path: Path):
    path = tmp_path / "loop.yaml"
    path.write_text("optimizer: {kwargs: &loop {again: *loop}}\n")
    with pytest.raises(ConfigError, match="alias \\*loop refers to a value that contains it"):
        read_yaml(path)


def test_deep_nesting_is_refused(tmp_path: Path):
    path = tmp_path / "deep.yaml"
    path.write_text("optimizer: {kwargs: {a: " + "[" * 50_000 + "]" * 50_000 + "}}\n")
    with pytest.raises(ConfigError, match=f"nests deeper than memfit's limit of {MAX_YAML_DEPTH}"):
        read_yaml(path)
    with pytest.raises(ConfigError, match="nests deeper"):
        parse_overrides(["optimizer.kwargs=" + "[" * 1000 + "]" * 1000])


def test_a_config_file_over_the_size_limit_is_refused_before_it_is_parsed(tmp_path: Path):
    path = tmp_path / "huge.yaml"
    path.write_text("model: {preset: tiny-llama}\n" + "#" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match=f"huge.yaml is .* bytes, beyond .*{MAX_CONFIG_BYTES:,}"):
        read_yaml(path)


def test_small_aliases_still_share_values(tmp_path: Path):
    path = tmp_path / "shared.yaml"
    path.write_text("adapter: {kind: lora, targets: &t [q_proj, v_proj]}\n"
                    "memory: {checkpoint_modules: *t}\nbase: &b {rank: 4}\n"
                    "other: {<<: *b, alpha: 8}\n")
    raw = read_yaml(path)
    assert raw["memory"]["checkpoint_modules"] == ["q_proj", "v_proj"]
    assert raw["other"] == {"rank": 4, "alpha": 8}


@pytest.mark.parametrize("text", [
    "my#file.jsonl", "runs/a #1", "runs/a\nb", " spaced ", "2026-13-45", "2026-01-01",
])
def test_an_override_read_as_a_string_is_taken_exactly_as_written(text: str):
    assert parse_overrides([f"data.path={text}"]) == {"data": {"path": text}}


@pytest.mark.parametrize("text, value", [
    ("10", 10), ("1.5", 1.5), ("true", True), ("null", None), ("", None),
    ("[q_proj, v_proj]", ["q_proj", "v_proj"]), ("[a,\n b]", ["a", "b"]),
    ("'q #1'", "q #1"), ('"a\\nb"', "a\nb"), ("{x: 1}", {"x": 1}),
])
def test_override_values_are_still_yaml(text: str, value: object):
    assert parse_overrides([f"a.b={text}"]) == {"a": {"b": value}}


@pytest.mark.parametrize("text, fragment", [
    ("10 # steps", "reads '# steps' as a comment"),
    ("[a, b] #1", "reads '#1' as a comment"),
    ("'x' #y", "reads '#y' as a comment"),
    ("[a, # b\n c]", "as a comment"),
    ('"a\nb"', "would fold the line break"),
])
def test_an_override_yaml_would_shorten_is_refused(text: str, fragment: str):
    with pytest.raises(ConfigError, match=fragment):
        parse_overrides([f"a.b={text}"])


def test_an_unreadable_number_is_one_line(tmp_path: Path):
    path = tmp_path / "digits.yaml"
    path.write_text(f"train: {{seed: [{'9' * 5000}]}}\n")
    with pytest.raises(ConfigError, match="digits.yaml is refused: a value cannot be read"):
        read_yaml(path)


# --- sizes and counts -----------------------------------------------------------------------

def test_the_defaults_are_inside_every_limit():
    check_int_limits(Config())


@pytest.mark.parametrize("key", sorted(INT_LIMITS))
def test_every_count_has_an_upper_limit_named_in_the_message(key: str):
    low, high = INT_LIMITS[key]
    with pytest.raises(ConfigError) as refused:
        from_mapping(with_key(key, high + 1))
    assert str(refused.value) == f"{key}={high + 1} is beyond memfit's limit of {high:,}"
    with pytest.raises(ConfigError, match=f"^{key} must be "):
        from_mapping(with_key(key, low - 1))


@pytest.mark.parametrize("key, value", [
    ("train.micro_batch_size", 10**23), ("train.max_steps", 10**30),
    ("train.seed", 2**64), ("distributed.nproc", 100_000), ("model.num_labels", 10**12),
])
def test_values_beyond_int64_are_refused(key: str, value: int):
    with pytest.raises(ConfigError, match=f"{key}={value} is beyond memfit's limit"):
        from_mapping(with_key(key, value))


def test_the_largest_seed_numpy_takes_is_accepted():
    assert from_mapping(with_key("train.seed", 2**32 - 1)).train.seed == 2**32 - 1


@pytest.mark.parametrize("budget, fragment", [
    ("1e400GiB", "'1e400GiB' is not a finite size"),
    ("2000000TiB", "memory.budget=2000000TiB is beyond memfit's limit of"),
    ("0GiB", "memory.budget must be above 0 bytes"),
    ("-1GiB", "is not a size"),
])
def test_a_budget_beyond_any_machine_is_refused(budget: str, fragment: str):
    with pytest.raises(ConfigError, match=fragment):
        from_mapping(with_key("memory.budget", budget))


@pytest.mark.parametrize("size", [math.inf, math.nan, "1e400GiB", "nanGiB"])
def test_parse_bytes_refuses_non_finite_sizes(size: object):
    with pytest.raises(ValueError):
        parse_bytes(size)  # type: ignore[arg-type]


def test_epochs_beyond_the_limit_are_refused():
    with pytest.raises(ConfigError, match="train.epochs=1e\\+300 is beyond memfit's limit of "
                                          "1,000,000"):
        from_mapping(with_key("train.epochs", 1e300))


@pytest.mark.parametrize("key", ["train.output_dir", "data.path", "model.path"])
@pytest.mark.parametrize("character", ["\n", "\t", "\x7f"])
def test_a_control_character_in_a_path_key_is_refused(key: str, character: str):
    raw = with_key(key, f"runs/a{character}b")
    if key == "model.path":
        del raw["model"]["preset"]
    with pytest.raises(ConfigError, match=f"^{key}=.* holds a control character") as refused:
        from_mapping(raw)
    assert "\n" not in str(refused.value)


def test_model_labels_beyond_the_class_limit_are_refused():
    raw = with_key("model.labels", [f"c{index}" for index in range(100_001)])
    raw["model"].update(task="sequence-classification", path="bert")
    del raw["model"]["preset"]
    raw["data"]["format"] = "classification"
    with pytest.raises(ConfigError, match="model.labels names 100,001 classes, beyond"):
        from_mapping(raw)
