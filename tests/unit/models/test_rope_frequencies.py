"""model.rope_scaling reaches the rotary embedding of the model memfit builds: its
frequencies and cos/sin are transformers' own for that method (from the documented
rope_parameters), differing from the unscaled ones as each method's formula says."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from memfit._utils.errors import ConfigError
from memfit.config.choices import RopeScaling
from memfit.config.rope import RopeScalingConfig
from memfit.config.schema import ModelConfig
from memfit.models.load import load_model
from memfit.models.presets import tiny_llama
from memfit.models.rope import context, suggestion, with_rope_scaling

NATIVE = 1024  # tiny-llama's max_position_embeddings
HEAD_DIM, THETA = 16, 10000.0


def rotary(rope: RopeScalingConfig, **model) -> torch.nn.Module:
    """The rotary embedding of the tiny Llama memfit loads with ``rope``."""
    config = ModelConfig(**{"preset": "tiny-llama", **model}, rope_scaling=rope)
    return load_model(config).model.model.rotary_emb


def unscaled() -> torch.Tensor:
    """The plain RoPE inverse frequencies, written out: theta^(-2i/d)."""
    return 1.0 / THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float) / HEAD_DIM)


def documented(rope_type: str, factor: float, **extra) -> tuple[torch.Tensor, float]:
    """transformers' frequencies and attention scaling for a Llama config written with the
    rope_parameters its docs give for the method (modeling_rope_utils.RopeParameters)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    parameters = {"rope_type": rope_type, "factor": factor, "rope_theta": THETA, **extra}
    positions = NATIVE if rope_type == "dynamic" else int(NATIVE * factor)
    config = LlamaConfig(**{**tiny_llama().to_dict(), "rope_parameters": parameters,
                            "max_position_embeddings": positions})
    return ROPE_INIT_FUNCTIONS[rope_type](config)


@pytest.mark.parametrize(("method", "extra"), [
    ("linear", {}),
    ("yarn", {"original_max_position_embeddings": NATIVE}),
    ("llama3", {"original_max_position_embeddings": NATIVE, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0}),
])
def test_the_rotary_frequencies_are_transformers_own_for_the_method(method, extra):
    factor = 4.0
    embedding = rotary(RopeScalingConfig(RopeScaling(method), factor))
    expected, scaling = documented(method, factor, **extra)
    torch.testing.assert_close(embedding.inv_freq, expected)
    assert embedding.attention_scaling == pytest.approx(scaling)
    assert embedding.config.max_position_embeddings == NATIVE * factor
    plain = unscaled()
    # The longest wavelength is stretched by the whole factor under every method ...
    assert embedding.inv_freq[-1].item() == pytest.approx(plain[-1].item() / factor, rel=1e-5)
    if method == "linear":  # ... and by linear, every one
        torch.testing.assert_close(embedding.inv_freq, plain / factor)
    else:  # yarn and llama3 keep the shortest as it is
        assert embedding.inv_freq[0].item() == pytest.approx(plain[0].item())
    if method == "yarn":  # and yarn scales attention by its temperature, 0.1 ln(s) + 1
        assert embedding.attention_scaling == pytest.approx(0.1 * math.log(factor) + 1)
    # cos/sin at positions past the native window: position x frequency, scaled.
    positions = torch.arange(NATIVE - 4, NATIVE + 4)[None]
    cos, sin = embedding(torch.zeros(1, dtype=torch.float32), positions)
    angles = positions[0, :, None].float() * embedding.inv_freq
    torch.testing.assert_close(cos[0], torch.cat([angles, angles], -1).cos() * scaling)
    torch.testing.assert_close(sin[0], torch.cat([angles, angles], -1).sin() * scaling)
    plain_cos, _ = rotary(RopeScalingConfig())(torch.zeros(1), positions)
    assert not torch.allclose(cos, plain_cos)


def test_dynamic_keeps_the_native_window_and_grows_the_base_past_it():
    """transformers' dynamic NTK reads max_position_embeddings as where scaling starts: the
    config keeps it, the context is it x factor, and past it the base becomes
    theta ((s L / W) - (s - 1))^(d / (d - 2))."""
    factor = 2.0
    embedding = rotary(RopeScalingConfig(RopeScaling.DYNAMIC, factor))
    assert embedding.config.max_position_embeddings == NATIVE
    assert context(embedding.config) == ("max_position_embeddings x rope_parameters.factor",
                                         2 * NATIVE)
    torch.testing.assert_close(embedding.inv_freq, unscaled())  # within the native window
    length = 2 * NATIVE
    embedding(torch.zeros(1), torch.arange(length)[None])
    base = THETA * (factor * length / NATIVE - (factor - 1)) ** (HEAD_DIM / (HEAD_DIM - 2))
    expected = 1.0 / base ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float) / HEAD_DIM)
    torch.testing.assert_close(embedding.inv_freq, expected)


def test_a_hugging_face_folder_is_scaled_as_the_preset_is(tmp_path):
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(tiny_llama()).save_pretrained(tmp_path)
    rope = RopeScalingConfig(RopeScaling.YARN, 4.0)
    folder = rotary(rope, preset=None, path=str(tmp_path))
    torch.testing.assert_close(folder.inv_freq, rotary(rope).inv_freq)
    assert folder.config.rope_parameters["original_max_position_embeddings"] == NATIVE


@pytest.mark.parametrize("method", ["linear", "dynamic", "yarn", "llama3"])
def test_scaling_a_scaled_config_again_changes_nothing(method):
    """A run's model/ folder carries the scaling and is loaded with the run's config, which
    names it again: the native window is found under the scaling, not multiplied twice."""
    rope = RopeScalingConfig(RopeScaling(method), 3.0)
    once = with_rope_scaling(tiny_llama(), rope, "model.preset=tiny-llama")
    twice = with_rope_scaling(once, rope, "model.preset=tiny-llama")
    assert twice.rope_parameters == once.rope_parameters
    assert twice.max_position_embeddings == once.max_position_embeddings
    assert context(once)[1] == 3 * NATIVE


def test_a_model_with_its_own_scaling_is_extended_from_its_pretraining_length():
    """Llama 3.1 ships llama3 scaling from 8,192 to 131,072 positions: its hint keeps the
    method and asks for 4 x its context, and the factor counts from 8,192."""
    from transformers import LlamaConfig

    config = LlamaConfig(**{**tiny_llama().to_dict(), "max_position_embeddings": 131072,
                            "rope_parameters": {
                                "rope_type": "llama3", "factor": 16.0, "rope_theta": 5e5,
                                "original_max_position_embeddings": 8192,
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0}})
    assert context(config) == ("max_position_embeddings", 131072)
    assert suggestion(config) == "model.rope_scaling.type=llama3 model.rope_scaling.factor=64"
    assert suggestion(tiny_llama(), needed=3000) == ("model.rope_scaling.type=yarn "
                                                     "model.rope_scaling.factor=4")
    scaled = with_rope_scaling(config, RopeScalingConfig(RopeScaling.LLAMA3, 64.0), "x")
    assert scaled.max_position_embeddings == 8192 * 64
    assert scaled.rope_parameters["rope_theta"] == 5e5


def test_models_that_cannot_be_scaled_are_refused_in_one_line():
    from transformers import Gemma3TextConfig

    rope = RopeScalingConfig(RopeScaling.YARN, 4.0)
    with pytest.raises(ConfigError, match=r"^model.rope_scaling.type=yarn: model.preset=gpt2 "
                                          r"has no rotary position embeddings to scale"):
        load_model(ModelConfig(preset="gpt2", rope_scaling=rope))
    gemma = Gemma3TextConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    with pytest.raises(ConfigError, match="keeps rotary parameters per layer type"):
        with_rope_scaling(gemma, rope, "model.path=gemma")
    with pytest.raises(ConfigError, match=r"model.rope_scaling.factor=1000000.0 makes "
                                          r"model.preset=tiny-llama's 1,024-token window "
                                          r"1,024,000,000 tokens, beyond memfit's limit"):
        load_model(ModelConfig(preset="tiny-llama", rope_scaling=replace(rope, factor=1e6)))
