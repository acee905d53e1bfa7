"""Bytes per device over several processes (distributed.strategy ddp and fsdp), and the
recommendation for N devices: data parallel when some strategy fits one device, FSDP2
otherwise (QLoRA: sharded first). Planning only: no process is started
(tests/distributed/test_ddp_plan.py measures)."""

from __future__ import annotations

from memfit.config.schema import Config
from memfit.plan import estimate, meta, plan, with_overrides
from memfit.plan.costs import grad_bytes, trainable_params
from memfit.plan.per_device import Layout, ddp_bucket_bytes
from memfit.plan.planner import load_plan_config
from memfit.plan.strategies import strategies
from memfit.techniques.optimizers import OptimizerSetting

ONE = {"distributed.strategy": "none", "distributed.nproc": 1}
DDP = {"distributed.strategy": "ddp", "distributed.nproc": 2}


def tiny_llama(*overrides: str) -> Config:
    return load_plan_config(None, ["model.preset=tiny-llama", "data.max_length=64",
                                   "train.micro_batch_size=1", *overrides])


def all_grad_bytes(config: Config) -> int:
    model = meta.build(meta.BuildInputs.of(config, "cuda")).model
    return grad_bytes(trainable_params(model, OptimizerSetting.of(config)))


def test_ddp_holds_one_process_bytes_and_its_buckets_for_the_whole_step():
    config = tiny_llama("optimizer.name=adamw")
    one = estimate(with_overrides(config, ONE), "cpu")
    ddp = estimate(with_overrides(config, DDP), "cpu")
    assert one.bytes["grads"] == 0  # one process peaks at the end of forward, before grads
    for category in ("weights", "optimizer", "activations"):
        assert ddp.bytes[category] == one.bytes[category]
    # ... where DDP's buckets already hold every gradient.
    assert ddp.peak_tensor_bytes == one.peak_tensor_bytes + all_grad_bytes(config)


def test_accumulating_under_ddp_accumulates_into_the_buckets():
    """memfit zeroes DDP's gradients in place between steps, so they stay bucket views
    and no micro-batch holds a second copy."""
    config = tiny_llama("optimizer.name=adamw", "train.gradient_accumulation_steps=2")
    assert estimate(with_overrides(config, DDP), "cpu").bytes["grads"] == \
        all_grad_bytes(config)


def test_galore_weights_projected_in_backward_are_reduced_outside_ddp_buckets():
    config = with_overrides(tiny_llama("optimizer.name=galore", "optimizer.galore.rank=16"),
                            DDP)
    model = meta.build(meta.BuildInputs.of(config, "cuda")).model
    params = trainable_params(model, OptimizerSetting.of(config))
    unprojected = sum(p.nbytes for p in params if not p.projected)
    assert 0 < unprojected < grad_bytes(params)
    assert ddp_bucket_bytes(params, Layout.of(config)) == unprojected
    full_gradients = with_overrides(config, {"optimizer.galore.project_in_backward": False})
    assert ddp_bucket_bytes(params, Layout.of(full_gradients)) == grad_bytes(params)
    layerwise = with_overrides(config, {"optimizer.layerwise": True})
    assert ddp_bucket_bytes(params, Layout.of(layerwise)) == 0


def test_layerwise_under_ddp_adds_the_gradient_whose_reduction_is_in_flight():
    config = tiny_llama("optimizer.layerwise=true")
    one = estimate(with_overrides(config, ONE), "cpu")
    ddp = estimate(with_overrides(config, DDP), "cpu")
    model = meta.build(meta.BuildInputs.of(config, "cuda")).model
    sizes = sorted(p.nbytes for p in trainable_params(model, OptimizerSetting.of(config)))
    assert ddp.peak_tensor_bytes - one.peak_tensor_bytes == sizes[-2]


def test_two_devices_plan_every_strategy_under_ddp_and_fsdp():
    result = plan(tiny_llama(), "64MiB", device="cpu", devices=2)
    ladder = [name for name, _ in strategies(chunked_loss_ok=True)]
    planned = [row.name for row in result.strategies]
    # The ladder's order, each strategy under ddp then under fsdp (QLoRA: fsdp first, its
    # base sharded before it is replicated): FSDP2's refusals are skipped for fsdp only.
    assert planned == [f"{strategy}:{name}" for name in ladder
                       for strategy in (("fsdp", "ddp") if name.startswith("qlora")
                                        else ("ddp", "fsdp"))
                       if f"{strategy}:{name}" not in result.skipped]
    # FSDP2 trains every rung but 8-bit GaLore (its inner state is quantized over whole rows).
    assert "fsdp:full-galore8bit-layerwise" in result.skipped
    assert all(name.startswith("fsdp:full-galore8bit-layerwise") for name in result.skipped)
    assert {"ddp:full-galore8bit-layerwise", "fsdp:full-adamw8bit"} <= set(planned)
    assert all(why.startswith("fsdp cannot train it") for why in result.skipped.values())
    for row in result.strategies:
        assert row.overrides["distributed.strategy"] == row.name.split(":")[0] == row.distributed
        assert row.overrides["distributed.nproc"] == 2
    assert result.recommended == "ddp:full-adamw"
    assert result.recommended_overrides["distributed.strategy"] == "ddp"
    assert result.reason.startswith("data parallel (ddp)")
    as_json = result.to_json()
    assert as_json["devices"] == 2 and as_json["config"]["distributed"] == "ddp"
    assert as_json["skipped"] == result.skipped


def test_the_given_config_is_planned_under_its_own_strategy_and_process_count():
    config = tiny_llama("distributed.strategy=fsdp", "distributed.nproc=2")
    result = plan(config, "64MiB", device="cpu")  # devices: distributed.nproc
    assert result.devices == 2 and result.config_distributed == "fsdp"
    assert result.config == estimate(config, "cpu")
    assert result.config.bytes["weights"] < estimate(with_overrides(config, DDP),
                                                     "cpu").bytes["weights"]


def test_a_preferred_method_sharded_is_recommended_before_a_lesser_one_replicated():
    result = plan(tiny_llama(), 2_250_000, device="cpu", devices=2)
    fits = {row.name for row in result.strategies if row.fits}
    # Replicated, full AdamW fits only with its state offloaded to the host (which the
    # planner counts as saved on a CPU device too: offload is measured there).
    assert not {"ddp:full-adamw", "ddp:full-adamw+ckpt"} & fits
    assert {"ddp:full-adamw8bit", "fsdp:full-adamw", "ddp:full-adamw+offload"} <= fits
    # Full AdamW (sharded, or replicated with its state on the host) before 8-bit AdamW
    # replicated: of full AdamW's mixes that fit, the one predicted fastest.
    chosen = next(row for row in result.strategies if row.name == result.recommended)
    assert chosen.method == "full-adamw"
    full = [row for row in result.strategies if row.fits and row.method == "full-adamw"]
    assert result.recommended_time.seconds <= min(row.time.seconds for row in full)
    assert "full-adamw is the most preferred method that fits" in result.reason


def test_fsdp_is_recommended_when_a_preferred_method_fits_only_sharded():
    """The budget is the bytes of the first FSDP2 row that needs less than every row
    preferred before it (ddp of its own method included), so it is the first that fits."""
    config = tiny_llama()
    rows = plan(config, 2**40, device="cpu", devices=2).strategies
    budget = next(row.estimate.device_bytes for position, row in enumerate(rows)
                  if row.distributed == "fsdp" and row.estimate.device_bytes
                  < min(r.estimate.device_bytes for r in rows[:position]))
    result = plan(config, budget, device="cpu", devices=2)
    first_fsdp = next(row for row in result.strategies if row.fits)
    assert first_fsdp.distributed == "fsdp"
    assert not next(row for row in result.strategies
                    if row.name == "ddp:" + first_fsdp.name.partition(":")[2]).fits
    # Its method is recommended, at the fastest of its mixes that fit (here all sharded).
    chosen = next(row for row in result.strategies if row.name == result.recommended)
    assert chosen.method == first_fsdp.method and chosen.distributed == "fsdp"
    mix = result.recommended.partition(":")[2]
    assert result.reason.startswith(f"FSDP2 (fsdp): {mix} does not fit one device under "
                                    f"data parallel (ddp:{mix} needs ")


def test_qlora_over_two_devices_takes_its_fastest_mix_sharded_or_replicated():
    """The budget fits both fsdp:qlora+ckpt and ddp:qlora+ckpt and nothing before them:
    QLoRA is the method, and of its mixes (fsdp listed first: its base sharded) the one
    predicted fastest is recommended (memory.auto takes the same recommendation)."""
    config = tiny_llama()
    rows = plan(config, 2**40, device="cpu", devices=2).strategies
    names = [row.name for row in rows]
    assert names.index("fsdp:qlora") < names.index("ddp:qlora")
    both = [row for row in rows if row.name in ("fsdp:qlora+ckpt", "ddp:qlora+ckpt")]
    budget = max(row.estimate.device_bytes for row in both)
    first = names.index("fsdp:qlora+ckpt")
    assert all(row.estimate.device_bytes > budget for row in rows[:first])
    result = plan(config, budget, device="cpu", devices=2)
    fitting = [r for r in result.strategies if r.fits]
    assert {"fsdp:qlora+ckpt", "ddp:qlora+ckpt"} <= {r.name for r in fitting}
    assert result.recommended.partition(":")[2].startswith("qlora")
    assert result.recommended_time.seconds <= min(r.time.seconds for r in fitting)
    assert "qlora is the most preferred method that fits" in result.reason
