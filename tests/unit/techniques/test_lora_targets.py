"""LoRA through PEFT: target resolution (kinds, classes, names, parts of a model), options,
and the errors a user sees when targets match nothing."""

from __future__ import annotations

import math

import pytest
import torch
from technique_models import Autoencoder, reconstruction_loss
from transformers import AutoModelForCausalLM

from memfit._utils.errors import ConfigError
from memfit.config.schema import AdapterConfig
from memfit.models.presets import tiny_llama
from memfit.techniques import lora


def llama():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_llama())


def leaves(names):
    return sorted({name.rsplit(".", 1)[-1] for name in names})


@pytest.mark.parametrize("kind, expected", [
    ("attention-qv", ["q_proj", "v_proj"]),
    ("attention", ["k_proj", "o_proj", "q_proj", "v_proj"]),
    ("mlp", ["down_proj", "gate_proj", "up_proj"]),
    ("all-linear", ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]),
])
def test_kinds_on_a_llama(kind, expected):
    names = lora.resolve_targets(llama(), AdapterConfig(targets=(kind,)))
    assert leaves(names) == expected
    assert len(names) == 2 * len(expected)  # both layers; never lm_head


def test_kinds_on_a_plain_autoencoder():
    model = Autoencoder()
    assert lora.resolve_targets(model, AdapterConfig(targets=("conv",))) == [
        "encoder.stem", "decoder.conv"]
    assert leaves(lora.resolve_targets(model, AdapterConfig(targets=("attention-qv",)))) == ["qkv"]
    assert leaves(lora.resolve_targets(model, AdapterConfig(targets=("attention",)))) == [
        "proj", "qkv"]
    mlp = lora.resolve_targets(model, AdapterConfig(targets=("mlp",)))
    assert mlp[:2] == ["encoder.blocks.0.mlp.0", "encoder.blocks.0.mlp.2"] and len(mlp) == 6
    # all-linear on a plain module includes its last layer (there is no LM head).
    assert "decoder.out" in lora.resolve_targets(model, AdapterConfig(targets=("all-linear",)))


def test_restrict_to_later_encoder_blocks_and_the_decoder():
    model = Autoencoder()
    later = lora.resolve_targets(model, AdapterConfig(
        targets=("attention",), restrict_to=("encoder.blocks.[1-2]",)))
    assert later == ["encoder.blocks.1.attn.qkv", "encoder.blocks.1.attn.proj",
                     "encoder.blocks.2.attn.qkv", "encoder.blocks.2.attn.proj"]
    decoder = lora.resolve_targets(model, AdapterConfig(
        targets=("Conv2d", "Linear"), restrict_to=("decoder",)))
    assert decoder == ["decoder.conv", "decoder.out"]
    by_name = lora.resolve_targets(model, AdapterConfig(targets=("encoder.blocks.*.attn.qkv",)))
    assert len(by_name) == 3


def test_targets_matching_nothing_list_the_candidates():
    with pytest.raises(ConfigError) as error:
        lora.resolve_targets(Autoencoder(), AdapterConfig(targets=("q_proj",)))
    message = str(error.value)
    assert "adapter.targets=['q_proj'] matched no module" in message
    assert "qkv" in message and "Conv2d" in message and "all-linear" in message
    with pytest.raises(ConfigError, match="restrict_to=.*top-level parts are: encoder, decoder"):
        lora.resolve_targets(Autoencoder(), AdapterConfig(restrict_to=("head",)))


def test_only_adapters_and_trainable_modules_train_and_gradients_flow():
    torch.manual_seed(0)
    model = lora.apply(Autoencoder(), AdapterConfig(
        rank=4, targets=("conv", "attention-qv"), trainable_modules=("decoder.out",)))
    lora.check_applied(model)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert all("lora_" in name or "decoder.out.modules_to_save" in name for name in trainable)
    assert any("decoder.out" in name for name in trainable)
    reconstruction_loss(model, torch.randn(2, 1, 8, 8)).backward()
    lora.check_gradients_reached(model)
    assert all(model.get_parameter(name).grad is not None for name in trainable)


def test_rslora_scaling_and_dora_magnitude():
    model = lora.apply(llama(), AdapterConfig(rank=4, alpha=8, rslora=True,
                                              targets=("attention-qv",)))
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert layer.scaling["default"] == pytest.approx(8 / math.sqrt(4))
    dora = lora.apply(llama(), AdapterConfig(rank=4, dora=True, targets=("attention-qv",)))
    assert any("lora_magnitude_vector" in name for name, _ in dora.named_parameters())


def test_trainable_module_that_is_also_a_target_is_refused():
    with pytest.raises(ConfigError, match="either adapted or trained in full"):
        lora.apply(Autoencoder(), AdapterConfig(targets=("Conv2d",),
                                                trainable_modules=("decoder.conv",)))


def test_plain_module_adapter_saves_and_loads_with_peft(tmp_path):
    from peft import PeftModel

    torch.manual_seed(0)
    model = lora.apply(Autoencoder(), AdapterConfig(rank=4, targets=("conv", "mlp")))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.05)  # make the adapter change the output
    model.save_pretrained(tmp_path)
    images = torch.randn(2, 1, 8, 8)
    torch.manual_seed(0)
    loaded = PeftModel.from_pretrained(Autoencoder(), tmp_path)
    torch.testing.assert_close(loaded(images), model(images))


class _Nested(torch.nn.Module):
    """``fc`` at the top and inside two parts: a leaf name alone is ambiguous here."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.encoder = torch.nn.Sequential()
        self.encoder.add_module("fc", torch.nn.Linear(4, 4))
        self.decoder = torch.nn.Sequential()
        self.decoder.add_module("fc", torch.nn.Linear(4, 4))


@pytest.mark.parametrize("targets, saved", [
    (["fc", "encoder.fc", "decoder.fc"], ["fc"]),
    (["encoder.fc", "decoder.fc"], ["decoder.fc", "encoder.fc"]),
    (["fc"], r"^(?:fc)$"),  # "fc" in a list would also match encoder.fc
])
def test_saved_target_modules_are_what_peft_reads_back_as_the_targets(targets, saved):
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer

    names = [name for name, _ in _Nested().named_modules() if name]
    found = lora.peft_target_modules(targets, names)
    assert found == saved
    # Oracle: PEFT itself adapts exactly the targets with it.
    adapted = get_peft_model(_Nested(), LoraConfig(r=2, target_modules=found))
    assert sorted(name.removeprefix("base_model.model.")
                  for name, module in adapted.named_modules()
                  if isinstance(module, LoraLayer)) == sorted(targets)
