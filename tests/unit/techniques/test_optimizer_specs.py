"""Every optimizer has a spec, and the spec's state bytes are the optimizer's: the planner's
figure (plan.costs over the spec) against the state a real step leaves, on Llama and on
GPT-2 (whose Conv1D layers GaLore projects too)."""

from __future__ import annotations

import pytest
import torch

from memfit._utils.errors import ConfigError
from memfit.config.schema import GaloreProjector
from memfit.plan import costs, next_cheaper
from memfit.techniques.config_checks import from_mapping
from memfit.techniques.optimizers import SPECS, OptimizerSetting, build_optimizer, spec_for
from memfit.techniques.optimizers.groups import galore_targets


def _config(optimizer: dict, **sections):
    return from_mapping({"model": {"preset": "tiny-llama"}, "data": {"path": "unused"},
                         "optimizer": optimizer, **sections})


def _llama() -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    from memfit.models.presets import PRESETS

    torch.manual_seed(0)
    return LlamaForCausalLM(PRESETS["tiny-llama"]())


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2,
                                      n_head=2))


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Distinct tensor storages in the state (bitsandbytes shares its quantisation maps)."""
    seen, total = set(), 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                total += value.numel() * value.element_size()
    return total


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = 2) -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for param in model.parameters():
            if param.requires_grad:
                param.grad = torch.randn(param.shape, generator=generator).to(param.dtype)
        optimizer.step()


def test_every_registered_optimizer_is_known_by_its_own_name() -> None:
    for name, spec in SPECS.items():
        assert spec.name == name and spec_for(_config({"name": name}).optimizer) is spec
    with pytest.raises(ConfigError, match="optimizer.name='lamb' is not one of: adamw, "):
        _config({"name": "lamb"})


GALORE = [{"name": "galore", "galore": {"projector": projector.value, "inner": "adamw",
                                        **({} if projector is GaloreProjector.APOLLO_MINI
                                           else {"rank": 4})}}
          for projector in GaloreProjector] + [
    {"name": "galore", "galore": {"rank": 4, "inner": "adamw8bit"}},
    {"name": "galore", "galore": {"rank": 4, "inner": "adafactor"}},
    {"name": "galore", "galore": {"rank": 4, "modules": ["mlp"]}}]
# Every registered optimizer with its defaults, then GaLore's variants.
CASES = [*({"name": name} for name in SPECS), *GALORE[1:]]


@pytest.mark.parametrize("model", [_llama, _gpt2], ids=["llama", "gpt2"])
@pytest.mark.parametrize("optimizer", CASES, ids=lambda o: "-".join(
    str(v) for v in [o["name"], *o.get("galore", {}).values()]))
def test_planned_state_is_the_state_a_step_leaves(model, optimizer: dict) -> None:
    config = _config(optimizer)
    built, setting = model(), OptimizerSetting.of(config)
    planned = costs.optimizer_cost(costs.trainable_params(built, setting), setting).state_bytes
    try:
        real = build_optimizer(built, setting)
    except ConfigError as error:  # paged_adamw8bit pages GPU memory
        if "needs CUDA" not in str(error):
            raise
        pytest.skip(str(error))
    _step(built, real)
    # bitsandbytes' two shared 256-value fp32 code books are the 8-bit optimizers' too.
    assert planned == _state_bytes(real)


def test_bf16_pure_adamw_is_memfits_with_fp32_moments() -> None:
    config = _config({"name": "adamw"}, precision="bf16-pure")
    built, setting = _llama().to(torch.bfloat16), OptimizerSetting.of(config)
    planned = costs.optimizer_cost(costs.trainable_params(built, setting), setting).state_bytes
    real = build_optimizer(built, setting)
    _step(built, real)
    assert planned == _state_bytes(real)


def test_galore_targets_are_linear_and_conv1d_layers_but_not_the_head() -> None:
    gpt2 = _gpt2()
    targets = galore_targets(gpt2, ())
    named = {id(p): name for name, p in gpt2.named_parameters()}
    assert sorted(named[t] for t in targets) == sorted(
        f"transformer.h.{layer}.{part}.weight" for layer in range(2)
        for part in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"))
    assert {named[t] for t in galore_targets(gpt2, ("mlp",))} == {
        f"transformer.h.{layer}.mlp.{part}.weight" for layer in range(2)
        for part in ("c_fc", "c_proj")}


def test_the_ladder_asks_the_optimizer_spec() -> None:
    adamw = OptimizerSetting.of(_config({"name": "adamw"}))
    assert spec_for(adamw.optimizer).cheaper(adamw) == {"optimizer.name": "adamw8bit"}
    galore8bit = OptimizerSetting.of(_config({"name": "galore", "galore": {"inner": "adamw8bit"}}))
    assert spec_for(galore8bit.optimizer).cheaper(galore8bit) is None
    # 8-bit AdamW cannot train bf16 weights: the ladder goes on to activation offload.
    pure = _config({"name": "adamw"}, precision="bf16-pure", train={"micro_batch_size": 1},
                   memory={"gradient_checkpointing": True, "chunked_loss": True})
    assert next_cheaper(pure) == {"memory.activation_offload": True}
