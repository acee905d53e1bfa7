"""LoRA on Linear / Conv subclasses and on the q, k, v parts of fused projections: each
adapted output is checked against a reference computed by hand from the factors, merged
models against adapted ones (fp32, 1e-5), and the rows no part names stay bit-identical."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, Phi3Config, Phi3ForCausalLM

from memfit._utils.errors import ConfigError
from memfit.config.schema import AdapterConfig
from memfit.plan import meta
from memfit.techniques import lora
from memfit.techniques.adapter_map import adapter_map
from memfit.techniques.config_checks import from_mapping
from memfit.techniques.technique_options import TechniqueOptions
from memfit.training.build import load_base, prepare_model


class SamePaddingConv2d(nn.Conv2d):
    """EfficientNet's Conv2dStaticSamePadding, in short: its own __init__ signature, and a
    forward that pads (TensorFlow "same") and then convolves."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int,
                 image_size: int):
        super().__init__(in_channels, out_channels, kernel_size, stride, bias=True)
        total = max((-(-image_size // stride) - 1) * stride + kernel_size - image_size, 0)
        self.pad = nn.ZeroPad2d((total // 2, total - total // 2, total // 2, total - total // 2))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return F.conv2d(self.pad(x), self.weight, self.bias, self.stride)


class OffsetLinear(nn.Linear):
    """A custom Linear subclass: its forward adds a learned-elsewhere offset buffer."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features)
        self.register_buffer("offset", torch.randn(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + self.offset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # 9 pixels, kernel 4, stride 2: TensorFlow pads 3, one before and two after
        self.stem = SamePaddingConv2d(3, 8, kernel_size=4, stride=2, image_size=9)
        self.head = OffsetLinear(8, 5)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.stem(images).mean(dim=(2, 3)))


class VitBlock(nn.Module):
    """torchvision's EncoderBlock in short: nn.MultiheadAttention, then an MLP."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.self_attention = nn.MultiheadAttention(width, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 64), nn.GELU(), nn.Linear(64, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attention(x, x, x, need_weights=False)[0]
        return x + self.mlp(x)


def randomized(model: nn.Module) -> nn.Module:
    """B starts at zero: give every factor values so that the updates show."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.normal_(0, 0.3)
    return model.eval()


def adapted(model: nn.Module, targets: tuple[str, ...]) -> nn.Module:
    torch.manual_seed(0)
    return randomized(lora.apply(model, AdapterConfig(kind="lora", rank=2, alpha=4,
                                                       targets=targets)))


def trainable(model: nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if p.requires_grad]


def test_a_same_padding_conv_subclass_runs_its_own_forward_and_merges_exactly():
    torch.manual_seed(0)
    net = Net()
    base_stem_weight = net.stem.weight.detach().clone()
    model = adapted(net, ("conv", "head"))
    stem = model.base_model.model.stem
    images = torch.randn(2, 3, 9, 9)
    calls = stem.base_layer.calls
    out = model(images)
    assert stem.base_layer.calls == calls + 1  # the subclass's forward ran (padding included)
    # By hand: the update is conv(pad(x), B A) with the layer's padding and stride.
    A, B = stem.lora_A["default"].weight, stem.lora_B["default"].weight[:, :, 0, 0]
    merged_weight = base_stem_weight + 2.0 * torch.einsum("or,rikl->oikl", B, A)
    reference = SamePaddingConv2d(3, 8, 4, 2, image_size=9)
    with torch.no_grad():
        reference.weight.copy_(merged_weight)
        reference.bias.copy_(stem.base_layer.bias)
    torch.testing.assert_close(stem(images), reference(images), rtol=0, atol=1e-5)
    head = model.base_model.model.head
    head_update = 2.0 * head.lora_B["default"].weight @ head.lora_A["default"].weight
    features = torch.randn(4, 8)
    torch.testing.assert_close(head(features), OffsetLinear.forward(head.base_layer, features)
                               + features @ head_update.T, rtol=0, atol=1e-5)
    merged = model.merge_and_unload()
    assert type(merged.stem) is SamePaddingConv2d and type(merged.head) is OffsetLinear
    torch.testing.assert_close(merged(images), out, rtol=0, atol=1e-5)


def test_attention_qv_on_a_timm_qkv_linear_updates_q_and_v_rows_only():
    block = nn.Module()
    block.attn = nn.Module()
    block.attn.qkv = nn.Linear(16, 48)
    block.forward = lambda x: block.attn.qkv(x)
    torch.manual_seed(0)
    base_weight = block.attn.qkv.weight.detach().clone()
    model = adapted(block, ("attention-qv",))
    qkv = model.base_model.model.attn.qkv
    assert sorted(trainable(model)) == [f"base_model.model.attn.qkv.lora_{f}.default.{p}.weight"
                                        for f in "AB" for p in "qv"]
    x = torch.randn(3, 16)
    out = qkv(x)
    base_out = F.linear(x, base_weight, qkv.base_layer.bias)
    for part, rows in (("q", slice(0, 16)), ("v", slice(32, 48))):
        factors = qkv.lora_A["default"][part].weight, qkv.lora_B["default"][part].weight
        update = 2.0 * x @ factors[0].T @ factors[1].T
        torch.testing.assert_close(out[:, rows], base_out[:, rows] + update, rtol=0, atol=1e-5)
    assert torch.equal(out[:, 16:32], base_out[:, 16:32])
    merged = model.merge_and_unload()
    assert type(merged.attn.qkv) is nn.Linear
    assert torch.equal(merged.attn.qkv.weight[16:32], base_weight[16:32])
    torch.testing.assert_close(merged.attn.qkv(x), out, rtol=0, atol=1e-5)


def test_gpt2_c_attn_parts_are_columns_of_its_transposed_weight():
    config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=16, vocab_size=50)
    torch.manual_seed(0)
    base = GPT2LMHeadModel(config).eval()
    key_columns = [block.attn.c_attn.weight[:, 32:64].clone() for block in base.transformer.h]
    tokens = torch.randint(0, 50, (2, 8))
    base_logits = base(tokens).logits
    model = adapted(base, ("attention-q", "attention-v"))
    assert lora.placed_parts(model) == {f"transformer.h.{i}.attn.c_attn":
                                        {"q": (0, 32), "v": (64, 96)} for i in range(2)}
    logits = model(tokens).logits
    assert not torch.allclose(logits, base_logits, atol=1e-3)  # the updates are there
    merged = model.merge_and_unload()
    for block, key in zip(merged.transformer.h, key_columns, strict=True):
        assert torch.equal(block.attn.c_attn.weight[:, 32:64], key)
    torch.testing.assert_close(merged(tokens).logits, logits, rtol=0, atol=1e-5)


def test_phi3_qkv_proj_parts_follow_grouped_query_sizes_from_the_config():
    config = Phi3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
                        max_position_embeddings=32, pad_token_id=0)
    torch.manual_seed(0)
    base = Phi3ForCausalLM(config).eval()
    key_rows = base.model.layers[0].self_attn.qkv_proj.weight[32:48].clone()
    tokens = torch.randint(1, 50, (2, 8))
    base_logits = base(tokens).logits
    model = adapted(base, ("attention-qv",))
    # q = 4 heads * 8, k = v = 2 kv heads * 8
    assert lora.placed_parts(model) == {"model.layers.0.self_attn.qkv_proj":
                                        {"q": (0, 32), "v": (48, 64)}}
    logits = model(tokens).logits
    assert not torch.allclose(logits, base_logits, atol=1e-3)
    merged = model.merge_and_unload()
    assert torch.equal(merged.model.layers[0].self_attn.qkv_proj.weight[32:48], key_rows)
    torch.testing.assert_close(merged(tokens).logits, logits, rtol=0, atol=1e-5)


def test_multihead_attention_takes_q_and_v_parts_and_never_its_out_proj_alone():
    torch.manual_seed(0)
    block = VitBlock()
    base_in_proj = block.self_attention.in_proj_weight.detach().clone()
    assert lora.resolve_targets(block, AdapterConfig(targets=("attention-qv",))) == [
        "self_attention"]
    # out_proj's forward is never called by nn.MultiheadAttention: all-linear adapts the
    # attention module (PEFT's layer: in_proj and out_proj) and the MLP, not out_proj alone.
    assert lora.resolve_targets(block, AdapterConfig(targets=("all-linear",))) == [
        "self_attention", "mlp.0", "mlp.2"]
    model = adapted(block, ("attention-qv",))
    x = torch.randn(2, 5, 32)
    out = model(x)
    attention = model.base_model.model.self_attention
    # By hand: the base attention with in_proj_weight + s B A on the q and v rows.
    delta = torch.zeros_like(base_in_proj)
    for part, rows in (("q", slice(0, 32)), ("v", slice(64, 96))):
        delta[rows] = (2.0 * attention.lora_B["default"][part].weight
                       @ attention.lora_A["default"][part].weight)
    reference_block = VitBlock()
    reference_block.load_state_dict({
        **{k.replace("base_layer.", ""): v for k, v in model.get_base_model().state_dict().items()
           if "lora_" not in k},
        "self_attention.in_proj_weight": base_in_proj + delta})
    torch.testing.assert_close(reference_block.eval()(x), out, rtol=0, atol=1e-5)
    merged = model.merge_and_unload()
    assert type(merged.self_attention) is nn.MultiheadAttention
    assert torch.equal(merged.self_attention.in_proj_weight[32:64], base_in_proj[32:64])
    torch.testing.assert_close(merged(x), out, rtol=0, atol=1e-5)


def test_part_kinds_choose_parts_and_separate_projections_alike():
    torch.manual_seed(0)
    model = lora.apply(VitBlock(), AdapterConfig(kind="lora", rank=2, targets=("attention-k",)))
    assert lora.placed_parts(model) == {"self_attention": {"k": (32, 64)}}
    assert "self_attention: 1 modules" in adapter_map(model, AdapterConfig(
        targets=("attention-k",))).to_text()


def test_a_fused_projection_that_does_not_split_in_three_is_one_line_error():
    block = nn.Module()
    block.qkv = nn.Linear(16, 40)
    with pytest.raises(ConfigError, match=r"qkv has 40 output rows, which do not split into "
                                          r"q, k, v blocks") as caught:
        lora.resolve_targets(block, AdapterConfig(targets=("attention-qv",)))
    assert "\n" not in str(caught.value)


def test_dora_on_parts_or_on_a_whole_multihead_attention_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="adapter.dora=true: DoRA cannot be placed on parts"):
        lora.apply(VitBlock(), AdapterConfig(kind="lora", rank=2, dora=True,
                                             targets=("attention-qv",)))
    with pytest.raises(ConfigError, match="PEFT cannot apply LoRA as configured: .*DoRA") as caught:
        lora.apply(VitBlock(), AdapterConfig(kind="lora", rank=2, dora=True,
                                             targets=("attention",)))
    assert "\n" not in str(caught.value)


def vit_net() -> nn.Module:
    """A factory (model.factory) for the planner test: two ViT blocks and a same-padding
    conv stem."""
    net = nn.Sequential()
    net.stem = SamePaddingConv2d(3, 32, kernel_size=3, stride=2, image_size=9)
    net.blocks = nn.Sequential(VitBlock(), VitBlock())
    return net


def test_the_planner_counts_the_adapter_parameters_training_has():
    config = from_mapping({"model": {"factory": "test_lora_fused:vit_net"},
                           "data": {"path": "unused"},
                           "adapter": {"kind": "lora", "rank": 4,
                                       "targets": ["attention-qv", "conv"]}})
    planned = meta.build(meta.BuildInputs.of(config, "cpu")).model
    real, _ = prepare_model(load_base(config), TechniqueOptions.of(config))
    assert lora.placed_parts(real) == lora.placed_parts(planned) == {
        f"blocks.{i}.self_attention": {"q": (0, 32), "v": (64, 96)} for i in range(2)}
    assert (sum(p.numel() for p in planned.parameters() if p.requires_grad)
            == sum(p.numel() for p in real.parameters() if p.requires_grad)
            == 2 * 2 * (4 * 32 + 32 * 4) + 4 * 3 * 3 * 3 + 32 * 4)


def test_an_adapter_on_a_multihead_attentions_out_proj_alone_is_caught():
    from peft import LoraConfig, get_peft_model

    # What PEFT does when told the name: an adapter nn.MultiheadAttention never calls.
    model = get_peft_model(VitBlock(), LoraConfig(r=2, target_modules=["out_proj"]))
    with pytest.raises(ConfigError, match="self_attention.out_proj is the out_proj of an "
                                          "nn.MultiheadAttention, whose forward never calls it"):
        lora.check_applied(model)
    # attention adapts nn.MultiheadAttention whole, through PEFT's layer (in_proj, out_proj)
    whole = adapted(VitBlock(), ("attention",))
    lora.check_applied(whole)
    x = torch.randn(2, 5, 32)
    out = whole(x)
    torch.testing.assert_close(whole.merge_and_unload()(x), out, rtol=0, atol=1e-5)


def test_gpt2_conv1d_layers_other_than_c_attn_parts_are_not_adapted():
    base = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=4, n_positions=16,
                                      vocab_size=50))
    assert lora.resolve_targets(base, AdapterConfig(targets=("attention-qv", "mlp"))) == [
        "transformer.h.0.attn.c_attn"]
    with pytest.raises(ConfigError, match="matched no module"):
        lora.resolve_targets(base, AdapterConfig(targets=("c_proj",)))
