"""What FSDP2 cannot train is refused at config time with the reason; the planner gives
bytes per device for N devices and skips those strategies (no processes started)."""

from __future__ import annotations

import pytest

from memfit._utils.errors import ConfigError
from memfit.config.overrides import with_overrides
from memfit.plan.itemize import estimate
from memfit.plan.planner import plan
from memfit.techniques.config_checks import from_mapping

BASE = {"model": {"preset": "tiny-llama"}, "data": {"path": "rows.jsonl"},
        "distributed": {"strategy": "fsdp"}}


@pytest.mark.parametrize(("key", "value", "named"), [
    ("optimizer.name", "paged_adamw8bit", "optimizer.name=paged_adamw8bit"),
    ("optimizer.galore", {"projector": "online"}, "optimizer.galore.projector=online"),
    ("optimizer.galore", {"inner": "adamw8bit"}, "optimizer.galore.inner=adamw8bit"),
    ("precision", "fp16", "precision=fp16"),
])
def test_unsupported_combinations_are_refused_with_the_reason(key: str, value, named: str):
    section, _, leaf = key.rpartition(".")
    mapping = {**BASE, section: {leaf: value}} if section else {**BASE, key: value}
    if leaf == "galore":
        mapping["optimizer"]["name"] = "galore"
    with pytest.raises(ConfigError, match=f"distributed.strategy=fsdp cannot be combined "
                                          f"with {named}"):
        from_mapping(mapping)


def test_several_processes_need_fsdp():
    with pytest.raises(ConfigError, match="distributed.nproc=2 needs distributed.strategy"):
        from_mapping({**BASE, "distributed": {"nproc": 2}})


def test_supported_combinations_validate():
    for adapter in ("none", "lora", "qlora"):
        from_mapping({**BASE, "adapter": {"kind": adapter}, "precision": "bf16"})
    for optimizer in ({"name": "adamw8bit"}, {"name": "adafactor"}, {"layerwise": True},
                      {"name": "galore", "galore": {"projector": "svd"}, "layerwise": True}):
        from_mapping({**BASE, "optimizer": optimizer})
    from_mapping({**BASE, "memory": {"optimizer_offload": True}})


def test_planner_divides_sharded_bytes_by_the_devices():
    config = from_mapping(BASE)
    one = estimate(with_overrides(config, {"distributed.strategy": "none"}), "cpu")
    two = estimate(with_overrides(config, {"distributed.nproc": 2}), "cpu")
    for category in ("weights", "grads", "optimizer"):
        assert two.bytes[category] == -(-one.bytes[category] // 2)
    assert two.bytes["activations"] == one.bytes["activations"]  # per-device micro-batch
    # qlora: the 4-bit base's codes and scales are sharded too (techniques.quantized_shards)
    qlora = {"adapter.kind": "qlora", "precision": "bf16"}
    assert (estimate(with_overrides(config, {**qlora, "distributed.nproc": 2}), "cpu")
            .bytes["weights"] == -(-estimate(with_overrides(
                config, {**qlora, "distributed.strategy": "none"}), "cpu").bytes["weights"] // 2))


def test_plan_for_devices_skips_what_fsdp_cannot_train():
    result = plan(from_mapping({**BASE, "distributed": {"strategy": "none"}}), "1GiB",
                  device="cpu", devices=2)
    assert "fsdp cannot train it" in result.skipped["fsdp:full-galore8bit-layerwise"]
    planned = {row.name for row in result.strategies}
    assert {"ddp:full-galore8bit-layerwise", "fsdp:full-adamw8bit"} <= planned
    assert result.recommended is not None
