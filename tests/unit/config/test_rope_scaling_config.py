"""model.rope_scaling in the config: loaded, round-tripped through config.yaml, and its bad
values refused in one line naming the key, the value and what is valid."""

from __future__ import annotations

import warnings

import pytest

from memfit._utils.errors import ConfigError
from memfit.config.choices import RopeScaling
from memfit.config.ignored import IgnoredKeyWarning
from memfit.config.load import to_yaml
from memfit.config.resume import check_resume_changes
from memfit.plan.planner import load_plan_config
from memfit.techniques.config_checks import from_mapping, load_config

TINY = ["model.preset=tiny-llama", "data.path=rows.jsonl", "data.format=instruction"]


def test_off_by_default_and_a_method_with_its_factor_loads():
    assert load_config(None, TINY).model.rope_scaling.type is RopeScaling.NONE
    rope = load_config(None, [*TINY, "model.rope_scaling.type=llama3",
                              "model.rope_scaling.factor=8"]).model.rope_scaling
    assert (rope.type, rope.factor, rope.low_freq_factor, rope.high_freq_factor) == (
        RopeScaling.LLAMA3, 8.0, 1.0, 4.0)  # transformers' Llama 3.1 values by default


def test_the_block_round_trips_through_config_yaml_and_a_resume_keeps_it():
    import yaml

    config = load_config(None, [*TINY, "model.rope_scaling.type=yarn",
                                "model.rope_scaling.factor=2.5"])
    again = from_mapping(yaml.safe_load(to_yaml(config)))
    assert again == config
    assert check_resume_changes(config, again, "run") == []
    other = from_mapping(yaml.safe_load(to_yaml(config).replace("factor: 2.5", "factor: 4.0")))
    with pytest.raises(ConfigError, match=r"cannot change model\.rope_scaling\.factor"):
        check_resume_changes(config, other, "run")


@pytest.mark.parametrize(("overrides", "message"), [
    (["model.rope_scaling.type=ntk"],
     "model.rope_scaling.type='ntk' is not one of: none, linear, dynamic, yarn, llama3"),
    (["model.rope_scaling.type=yarn", "model.rope_scaling.factor=1"],
     "model.rope_scaling.factor must be above 1 (the native window times it), got 1.0"),
    (["model.rope_scaling.type=yarn", "model.rope_scaling.factor=.nan"],
     "model.rope_scaling.factor must be above 1 (the native window times it), got nan"),
    (["model.rope_scaling.factor=4"],
     "model.rope_scaling.factor=4.0 needs model.rope_scaling.type, one of: linear, dynamic, "
     "yarn, llama3"),
    (["model.rope_scaling.type=linear"],
     "model.rope_scaling.type=linear needs model.rope_scaling.factor (how many times the "
     "native window, a number above 1, e.g. 4)"),
    (["model.rope_scaling.type=llama3", "model.rope_scaling.factor=8",
      "model.rope_scaling.low_freq_factor=4", "model.rope_scaling.high_freq_factor=2"],
     "model.rope_scaling.high_freq_factor=2.0 must be above "
     "model.rope_scaling.low_freq_factor=4.0"),
    (["model.preset=null", "model.factory=factories:regressor", "model.task=custom",
      "data.format=tensors", "model.rope_scaling.type=yarn", "model.rope_scaling.factor=4"],
     "model.rope_scaling.type=yarn applies to causal-lm and sequence-classification models "
     "of model.path or model.preset with rotary position embeddings, not model.factory"),
    (["model.preset=conv-autoencoder", "model.task=autoencoder", "data.format=images",
      "model.rope_scaling.type=linear", "model.rope_scaling.factor=2"],
     "not model.task=autoencoder; set model.rope_scaling.type=none"),
])
def test_bad_values_are_one_line_naming_the_key(overrides: list[str], message: str):
    with pytest.raises(ConfigError) as raised:
        load_config(None, [*TINY, *overrides])
    assert message in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(ConfigError) as planned:  # memfit plan refuses them the same way
        load_plan_config(None, [*TINY, *overrides])
    assert str(planned.value) == str(raised.value)


def test_llama3_keys_under_another_method_are_warned_as_ignored():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(None, [*TINY, "model.rope_scaling.type=yarn", "model.rope_scaling.factor=4",
                           "model.rope_scaling.high_freq_factor=8"])
    messages = [str(w.message) for w in caught if issubclass(w.category, IgnoredKeyWarning)]
    assert messages == ["model.rope_scaling.high_freq_factor=8.0 is ignored: it applies with "
                        "model.rope_scaling.type=llama3, not yarn"]
