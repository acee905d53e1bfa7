from pathlib import Path

import pytest

from memfit._utils.errors import ConfigError
from memfit.config import to_mapping
from memfit.config.schema import AdapterKind, Config, Precision
from memfit.techniques.config_checks import from_mapping, load_config

MINIMAL = {"model": {"preset": "tiny-llama"}, "data": {"path": "rows.jsonl"}}


def config_with(**sections) -> dict:
    raw = {key: dict(value) for key, value in MINIMAL.items()}
    for section, values in sections.items():
        raw[section] = {**raw.get(section, {}), **values} if isinstance(values, dict) else values
    return raw


def test_minimal_config_gets_documented_defaults():
    config = from_mapping(MINIMAL)
    assert config.optimizer.name == "adamw"
    assert config.optimizer.betas is None  # the optimizer's own (AdamW: (0.9, 0.999))
    assert config.precision is Precision.FP32
    assert config.adapter.kind is AdapterKind.NONE
    assert config.train.micro_batch_size == 4


def test_round_trip_through_plain_mapping():
    config = from_mapping(config_with(adapter={"kind": "lora", "targets": ["q_proj", "v_proj"]},
                                      optimizer={"betas": [0.8, 0.9]}))
    assert from_mapping(to_mapping(config)) == config


@pytest.mark.parametrize("raw, expected", [
    (config_with(modle={}), "unknown key modle; did you mean model?"),
    (config_with(train={"micro_batch_siz": 2}),
     "unknown key train.micro_batch_siz; did you mean train.micro_batch_size?"),
    (config_with(train={"micro_batch_size": "two"}), "train.micro_batch_size must be a whole"),
    (config_with(train={"micro_batch_size": 1.5}), "train.micro_batch_size must be a whole"),
    (config_with(precision="bf8"), "precision='bf8' is not one of: fp32, bf16, fp16, bf16-pure"),
    (config_with(log={"tensorboard": "yes"}), "log.tensorboard must be true or false"),
    (config_with(optimizer={"lr": "fast"}), "optimizer.lr must be a number"),
    (config_with(train={"micro_batch_size": 0}), "train.micro_batch_size must be at least 1"),
    (config_with(data={"eval_fraction": 1.0}), "data.eval_fraction must be in [0, 1)"),
    (config_with(model={"path": "x"}), "set exactly one of model.path, model.preset"),
    (config_with(model={"preset": None, "factory": "no_colon"}),
     "must look like 'package.module:function'"),
    (config_with(memory={"budget": "lots"}), "memory.budget: 'lots' is not a size"),
    (config_with(memory={"auto": True}), "memory.auto=true needs memory.budget"),
    (config_with(data={"format": "tensors"}), "model.task=causal-lm needs data.format"),
    (config_with(distributed={"strategy": "fsdp"},
                 optimizer={"name": "galore", "galore": {"projector": "online"}}),
     "distributed.strategy=fsdp cannot be combined with optimizer.galore.projector=online"),
    (config_with(optimizer={"name": "torch.optim:SGD", "kwargs": [0.9]}),
     "optimizer.kwargs must be a mapping of name: value"),
    (config_with(precision="bf16-pure", optimizer={"name": "torch.optim:SGD"}),
     "precision=bf16-pure needs optimizer.name adamw or galore"),
])
def test_bad_values_name_the_key_and_the_choices(raw, expected):
    with pytest.raises(ConfigError) as caught:
        from_mapping(raw)
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_scientific_notation_without_dot_is_a_number():
    # YAML 1.1 reads 1e-4 as a string; users write it anyway.
    assert from_mapping(config_with(optimizer={"lr": "1e-4"})).optimizer.lr == 1e-4


def test_overrides_apply_on_top_of_the_file(tmp_path: Path):
    path = tmp_path / "run.yaml"
    path.write_text("model: {preset: tiny-llama}\ndata: {path: rows.jsonl}\n"
                    "train: {max_steps: 5}\n")
    config = load_config(path, ["train.max_steps=7", "adapter.kind=lora",
                                "adapter.targets=[q_proj, v_proj]", "optimizer.lr=3e-4"])
    assert config.train.max_steps == 7
    assert config.adapter.targets == ("q_proj", "v_proj")
    assert config.optimizer.lr == 3e-4


def test_relative_paths_in_a_file_resolve_against_its_folder(tmp_path: Path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "run.yaml"
    path.write_text("model: {preset: tiny-llama}\ndata: {path: ../rows.jsonl}\n")
    assert load_config(path, []).data.path == str((tmp_path / "rows.jsonl").resolve())


@pytest.mark.parametrize("text, expected", [
    ("model: [unclosed\n", "is not valid YAML at line"),
    ("- a\n- b\n", "must be a mapping of sections"),
])
def test_malformed_yaml_is_one_line(tmp_path: Path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=expected):
        load_config(path, [])


def test_override_without_equals_is_rejected():
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        load_config(None, ["=3"], base=MINIMAL)


def test_config_is_frozen():
    config = from_mapping(MINIMAL)
    with pytest.raises(AttributeError):
        config.train = None  # type: ignore[misc]
    assert isinstance(config, Config)


def test_relative_paths_given_as_overrides_become_absolute(tmp_path, monkeypatch):
    """A run's config.yaml must name the same files when resumed from another folder."""
    monkeypatch.chdir(tmp_path)
    config = load_config(None, ["model.preset=tiny-llama", "data.path=rows.jsonl",
                                "data.eval_path=~/eval.jsonl"])
    assert config.data.path == str(tmp_path / "rows.jsonl")
    assert config.data.eval_path == str(Path.home() / "eval.jsonl")
