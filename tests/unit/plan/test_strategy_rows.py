"""The planner's strategy rows come from the specs (#36 item 2): the methods from each
optimizer spec's and the adapter spec's ``plan_methods``, the levels from the technique
specs' ``level``, and every row resets what changes what is trained (a technique spec's
``row_reset``), so no row inherits the user's freezing, quantization or partial levels."""

from __future__ import annotations

import pytest

from memfit.config.overrides import differing
from memfit.plan import plan, with_overrides
from memfit.plan.planner import load_plan_config
from memfit.plan.report import format_plan
from memfit.plan.strategies import METHODS, strategies
from memfit.techniques.optimizers import SPECS
from memfit.techniques.registry import TECHNIQUES

TINY = ["model.preset=tiny-llama", "data.max_length=64", "train.micro_batch_size=2"]


def _rows(overrides: list[str]) -> dict[str, int]:
    """Each row's planned device bytes, by name ("config": the config as given)."""
    result = plan(load_plan_config(None, [*TINY, *overrides]), None, device="cpu")
    return {"config": result.config.device_bytes,
            **{row.name: row.estimate.device_bytes for row in result.strategies}}


def test_the_methods_are_the_specs_declared_ones_in_the_documented_order():
    declared = [name for spec in SPECS.values() for name, _ in spec.plan_methods]
    declared += [name for spec in TECHNIQUES for name, _ in spec.plan_methods]
    assert [name for name, _ in METHODS] == declared == [
        "full-adamw", "full-adamw8bit", "full-adafactor", "full-galore",
        "full-galore8bit-layerwise", "full-galore-layerwise", "lora", "qlora"]
    # A method's optimizer is the spec that declared it.
    for spec in SPECS.values():
        for name, _ in spec.plan_methods:
            assert dict(METHODS)[name]["optimizer.name"] == spec.name


def test_each_level_switches_on_the_techniques_of_the_levels_up_to_it():
    rows = dict(strategies(chunked_loss_ok=True, tiled_mlp_ok=True, tiled_norms_ok=True))
    switched = {level: {spec.row_reset[0] for spec in TECHNIQUES if spec.level == level}
                for level in ("+ckpt", "+offload")}
    assert switched == {"+ckpt": {"memory.gradient_checkpointing", "memory.chunked_loss",
                                  "memory.tiled_mlp", "memory.tiled_norms"},
                        "+offload": {"memory.activation_offload", "memory.optimizer_offload"}}
    for key in switched["+ckpt"] | switched["+offload"]:
        assert rows["full-adamw"][key] is False
    assert all(rows["full-adamw+ckpt"][key] for key in switched["+ckpt"])
    assert not any(rows["full-adamw+ckpt"][key] for key in switched["+offload"])
    assert all(rows["full-adamw+offload"][key] for key in switched["+ckpt"] | switched["+offload"])
    # Adapters keep their state on the device; layer-wise steps run inside backward.
    assert rows["lora+offload"]["memory.optimizer_offload"] is False
    assert rows["full-galore-layerwise+offload"]["memory.optimizer_offload"] is False
    assert rows["full-adamw+ckpt"]["memory.checkpoint_blocks"] is None  # every block


@pytest.mark.parametrize("users_choice", [
    ["memory.freeze_embeddings=true"],  # freezing: the full-* rows train every weight
    ["memory.gradient_checkpointing=true", "memory.checkpoint_blocks=1"],  # a partial level
    ["memory.activation_offload=true", "memory.offload_blocks=1"],
])
def test_no_row_inherits_the_users_freezing_or_partial_levels(users_choice):
    plain, chosen = _rows(["adapter.kind=none"]), _rows(["adapter.kind=none", *users_choice])
    assert chosen.pop("config") != plain.pop("config")
    assert chosen == plain


def test_the_qlora_rows_quantize_as_the_method_does_whatever_the_config_quantizes():
    nf4, int8 = _rows(["adapter.kind=lora"]), _rows(["adapter.kind=lora",
                                                     "adapter.quantization=int8"])
    assert {name: int8[name] for name in int8 if name.startswith("qlora")} == {
        name: nf4[name] for name in nf4 if name.startswith("qlora")}


def test_apply_with_names_only_what_differs_from_the_config():
    config = load_plan_config(None, [*TINY, "adapter.kind=none", "optimizer.name=adamw",
                                     "precision=bf16"])
    result = plan(config, 2**40, device="cpu")
    assert result.recommended == "full-adamw"
    changes = differing(config, result.recommended_overrides)
    assert changes == {}  # the config is the row already; the micro-batch is its own
    assert "apply with:" not in format_plan(result, config)
    lora = dict(strategies(chunked_loss_ok=True))["lora+ckpt"]
    assert differing(config, lora) == {
        "adapter.kind": "lora", "model.dtype": "bfloat16",
        "memory.gradient_checkpointing": True, "memory.chunked_loss": True}
    # Applying only the differences gives the row's config.
    assert with_overrides(config, differing(config, lora)) == with_overrides(config, lora)
