"""The technique registry: every memory-technique key of the config has a spec, each spec
names real keys, and training (training.build) and the planner (plan.meta) walking the
one list build the same model: same modules, same names, same checkpointed blocks."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest
import torch

from memfit._utils.errors import ConfigError
from memfit.config.fields import is_own_keys
from memfit.config.schema import AdapterConfig, AdapterKind, Config, MemoryConfig, Precision
from memfit.plan import meta
from memfit.techniques import checkpointing, registry, specs
from memfit.techniques.config_checks import from_mapping
from memfit.techniques.optimizer_offload import HostOffloadOptimizer
from memfit.techniques.own_keys import names
from memfit.training.build import load_base, prepare_model, seed_everything

# Settings of the planner and the OOM ladder, not techniques applied to the model.
NOT_TECHNIQUES = {"memory.budget", "memory.auto", "memory.auto_keep_adapters",
                  "memory.recover_from_oom", "memory.oom_rung"}
# precision=fp32 is no technique: nothing is applied.
PLAIN = {"precision=fp32", "adapter.kind=none"}


def all_keys() -> set[str]:
    return {key for spec in registry.TECHNIQUES for key in spec.keys}


def technique_keys() -> set[str]:
    """The schema's memory-technique keys, and the techniques' own (own_keys.py)."""
    keys = {f"memory.{field.name}" for field in dataclasses.fields(MemoryConfig)
            if not is_own_keys(field)}
    keys |= {f"memory.{key}" for spec in registry.TECHNIQUES for key in names(spec.own)}
    keys |= {f"adapter.{field.name}" for field in dataclasses.fields(AdapterConfig)
             if field.name != "kind"}
    keys |= {f"adapter.kind={kind.value}" for kind in AdapterKind}
    keys |= {f"precision={precision.value}" for precision in Precision}
    return keys - NOT_TECHNIQUES - PLAIN


def test_every_technique_key_has_a_spec():
    missing = technique_keys() - all_keys()
    assert not missing, f"no TechniqueSpec answers to {sorted(missing)}"


def test_every_spec_key_is_a_config_key_or_value():
    assert all_keys() <= technique_keys()


def test_every_spec_file_is_registered_once():
    """techniques/specs/ holds one file per technique, each with its SPEC, and the registry
    lists each of them once."""
    folder = Path(specs.__file__).parent
    files = sorted(path.stem for path in folder.glob("*.py"))
    files = [name for name in files if name not in ("__init__", "spec")]
    spec_of = {name: importlib.import_module(f"memfit.techniques.specs.{name}").SPEC
               for name in files}
    unlisted = [name for name, spec in spec_of.items() if spec not in registry.TECHNIQUES]
    assert not unlisted, f"techniques/specs/ files not in registry.TECHNIQUES: {unlisted}"
    listed = [spec.name for spec in registry.TECHNIQUES]
    assert sorted(listed) == sorted(spec.name for spec in spec_of.values())


def test_names_are_unique_and_stages_known():
    names = [spec.name for spec in registry.TECHNIQUES]
    assert len(names) == len(set(names))
    assert {spec.stage for spec in registry.TECHNIQUES} <= set(registry.STAGES)


def tiny_llama(tmp_path, **sections) -> Config:
    return from_mapping({"model": {"preset": "tiny-llama"}, "data": {"path": str(tmp_path)},
                         **sections})


def built_and_planned(config: Config):
    seed_everything(0)
    model, warnings = prepare_model(load_base(config), registry.TechniqueOptions.of(config))
    return model, warnings, meta.build(meta.BuildInputs.of(config, "cpu")).model


def module_tree(model: torch.nn.Module) -> list[tuple[str, str]]:
    return [(name, type(module).__name__) for name, module in model.named_modules()]


def test_build_and_plan_apply_checkpointing_and_lora_in_the_same_order(tmp_path):
    config = tiny_llama(tmp_path, adapter={"kind": "lora", "targets": ["attention-qv"]},
                        memory={"gradient_checkpointing": True}, precision="bf16")
    model, warnings, planned = built_and_planned(config)
    assert warnings == []
    assert module_tree(model) == module_tree(planned)
    assert checkpointing.checkpointed_blocks(model) == checkpointing.checkpointed_blocks(
        planned) == 2
    # Frozen weights in the compute dtype, adapters in fp32, in both.
    dtypes = lambda m: [(n, p.dtype, p.requires_grad) for n, p in m.named_parameters()]  # noqa: E731
    assert dtypes(model) == dtypes(planned)


def test_the_planners_4bit_stand_in_takes_the_quantized_layers_places(tmp_path):
    """Training quantizes while loading, the planner after the adapters (registry
    docstring): the same layers end up quantized, inside the same adapter wrappers."""
    import bitsandbytes as bnb

    from memfit.techniques.quantize_stand_in import QuantizedLinear

    config = tiny_llama(tmp_path, adapter={"kind": "qlora", "targets": ["attention-qv"]},
                        precision="bf16")
    model, _, planned = built_and_planned(config)
    quantized = [name for name, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]
    stand_ins = [name for name, m in planned.named_modules() if isinstance(m, QuantizedLinear)]
    assert quantized and quantized == stand_ins
    trainable = lambda m: [n for n, p in m.named_parameters() if p.requires_grad]  # noqa: E731
    assert trainable(model) == trainable(planned)


def test_checks_run_for_enabled_techniques_only(tmp_path):
    config = tiny_llama(tmp_path, memory={"gradient_checkpointing": True})
    model = load_base(config).model  # never checkpointed
    with pytest.raises(ConfigError, match="memory.gradient_checkpointing=true"):
        registry.check_applied(model, registry.TechniqueOptions.of(config))
    plain = tiny_llama(tmp_path)
    assert registry.check_applied(model, registry.TechniqueOptions.of(plain)) == []


@pytest.mark.parametrize("offload", [True, False])
def test_the_optimizer_stage_wraps_the_optimizer_when_offloading(tmp_path, offload):
    config = tiny_llama(tmp_path, memory={"optimizer_offload": offload})
    model = torch.nn.Linear(2, 2)
    setting = registry.setting(model, registry.TechniqueOptions.of(config), is_transformers=False,
                               device="cpu")
    optimizer = registry.apply_stage("optimizer", torch.optim.SGD(model.parameters()), setting)
    assert isinstance(optimizer, HostOffloadOptimizer) is offload


def test_bf16_pure_is_cast_in_the_device_stage_and_planned_in_bf16(tmp_path):
    config = tiny_llama(tmp_path, precision="bf16-pure", optimizer={"name": "adamw"})
    model = torch.nn.Linear(2, 2)
    setting = registry.setting(model, registry.TechniqueOptions.of(config), is_transformers=False,
                               device="cpu")
    assert registry.apply_stage("model", model, setting).weight.dtype == torch.float32
    assert registry.apply_stage("device", model, setting).weight.dtype == torch.bfloat16
    planned = meta.build(meta.BuildInputs.of(config, "cuda")).model
    assert {p.dtype for p in planned.parameters()} == {torch.bfloat16}
