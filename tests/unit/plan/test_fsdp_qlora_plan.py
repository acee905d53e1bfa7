"""The planner's view of QLoRA under FSDP2 (techniques/quantized_shards.py; the 4-bit
base divided over the processes: tests/distributed/test_fsdp_rules.py): a block's codes
and scales in the all-gather working set, FSDP2's host offload (CPUOffloadPolicy) with
each process's shards counted as host bytes, and that offload as the OOM ladder's last
rung. tests/distributed/test_fsdp_qlora.py measures the sharded base."""

from __future__ import annotations

from memfit.config.schema import AdapterConfig
from memfit.plan import estimate, meta, with_overrides
from memfit.plan.costs import grad_bytes, trainable_params
from memfit.plan.itemize import _units
from memfit.plan.planner import load_plan_config
from memfit.plan.strategies import next_cheaper
from memfit.techniques.optimizers import OptimizerSetting
from memfit.techniques.quantize import quantized_weight_bytes

FSDP = {"distributed.strategy": "fsdp", "distributed.nproc": 2}
# The tiny Llama's linear layers in one block (out, in): q, k, v, o, gate, up, down.
BLOCK_LINEARS = [(64, 64), (32, 64), (32, 64), (64, 64), (176, 64), (176, 64), (64, 176)]


def tiny_qlora(*overrides: str):
    return load_plan_config(None, ["model.preset=tiny-llama", "data.max_length=64",
                                   "train.micro_batch_size=1", "adapter.kind=qlora",
                                   *overrides])


def test_a_block_gathers_its_codes_and_scales():
    config = with_overrides(tiny_qlora(), FSDP)
    model = meta.build(meta.BuildInputs.of(config, "cuda")).model
    block = model.base_model.model.model.layers[0]
    floating = sum(p.nbytes for p in block.parameters() if p.is_floating_point())
    quantized = sum(quantized_weight_bytes(out, inputs, AdapterConfig(kind="qlora"))
                    for out, inputs in BLOCK_LINEARS)
    assert _units(model).block == floating + quantized


def test_host_offload_under_fsdp_holds_each_process_shards_on_the_host():
    config = with_overrides(tiny_qlora(), FSDP)
    on_device = estimate(config, "cuda")
    offloaded_config = with_overrides(config, {"memory.optimizer_offload": True})
    offloaded = estimate(offloaded_config, "cuda")
    # Only what FSDP2 does not shard (buffers) stays; no state on the device.
    assert offloaded.bytes["optimizer"] == 0
    assert offloaded.bytes["weights"] < on_device.bytes["weights"]
    moved = on_device.bytes["weights"] - offloaded.bytes["weights"]
    model = meta.build(meta.BuildInputs.of(config, "cuda")).model
    params = trainable_params(model, OptimizerSetting.of(config))
    # Process 0's shards (the largest), their grads and state, and the host step's scratch.
    least = moved + on_device.bytes["optimizer"] + -(-grad_bytes(params) // 2)
    assert least <= offloaded.host_bytes <= least + on_device.bytes["optimizer"]
    assert offloaded.device_bytes < on_device.device_bytes
    # On a CPU device the shards are host-tagged and counted apart too (host_offload.py).
    on_cpu = estimate(offloaded_config, "cpu")
    assert (on_cpu.bytes, on_cpu.host_bytes) == (offloaded.bytes, offloaded.host_bytes)


def test_the_oom_ladder_ends_with_host_offload_for_sharded_qlora_only():
    def bottom(config):
        while (overrides := next_cheaper(config)) is not None:
            config = with_overrides(config, overrides)
        return config

    assert bottom(with_overrides(tiny_qlora(), FSDP)).memory.optimizer_offload
    assert not bottom(tiny_qlora()).memory.optimizer_offload  # one process: as LoRA
    assert not bottom(with_overrides(tiny_qlora("adapter.kind=lora"),
                                     FSDP)).memory.optimizer_offload

