"""The planner sees model.rope_scaling: the context it checks and searches is the scaled
one, its meta model is built from the scaled config, and without scaling it names the
overrides that go past a RoPE model's window."""

from __future__ import annotations

import pytest

from memfit._utils.errors import ConfigError
from memfit.plan import meta
from memfit.plan.context import check_max_length, context_length
from memfit.plan.longest import longest_fit
from memfit.plan.planner import load_plan_config
from memfit.plan.report import format_longest

TINY = ["model.preset=tiny-llama", "train.micro_batch_size=1"]
YARN = ["model.rope_scaling.type=yarn", "model.rope_scaling.factor=2"]


def test_the_context_is_the_native_window_times_the_factor():
    scaled = load_plan_config(None, [*TINY, *YARN, "data.max_length=2048"])
    assert context_length(scaled.model) == ("max_position_embeddings", 2048)
    check_max_length(scaled.model, 2048)  # 2,048 tokens fit the scaled window
    model = meta.build(meta.BuildInputs.of(scaled, "cpu")).model
    assert model.config.rope_parameters["rope_type"] == "yarn"
    assert model.model.rotary_emb.attention_scaling > 1  # yarn's temperature, on meta too


@pytest.mark.parametrize(("overrides", "ending"), [
    ([], "set data.max_length to 1024 or less, or extend the context with "
         "model.rope_scaling.type=yarn model.rope_scaling.factor=4"),
    (YARN, "(max_position_embeddings=2048); set data.max_length to 2048 or less, or a larger "
           "model.rope_scaling.factor"),
    (["model.preset=gpt2"], "(max_position_embeddings=1024); set data.max_length to 1024 or "
                            "less"),
])
def test_data_max_length_past_the_context_says_how_to_go_beyond(overrides, ending):
    config = load_plan_config(None, [*TINY, *overrides, "data.max_length=3000"])
    with pytest.raises(ConfigError) as raised:
        check_max_length(config.model, config.data.max_length)
    assert str(raised.value).startswith("data.max_length=3000 is beyond the context of ")
    assert str(raised.value).endswith(ending)


def test_max_length_searches_the_scaled_window_and_hints_without_scaling():
    native = load_plan_config(None, TINY)
    found = longest_fit(native, "1GiB", "cpu")
    assert (found.max_length, found.context) == (1024, 1024)
    assert found.beyond == "model.rope_scaling.type=yarn model.rope_scaling.factor=4"
    assert format_longest(found, native).splitlines()[-1] == (
        "set model.rope_scaling.type=yarn model.rope_scaling.factor=4 to train past the "
        "1,024-token window")
    scaled = load_plan_config(None, [*TINY, *YARN])
    found = longest_fit(scaled, "1GiB", "cpu")
    # Every candidate reaches the scaled window; the config as given is preferred there.
    assert (found.max_length, found.context, found.strategy) == (2048, 2048,
                                                                "config (as given)")
    assert found.beyond is None and "rope_scaling" not in format_longest(found, scaled)
