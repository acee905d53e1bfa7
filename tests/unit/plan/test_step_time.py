"""The planner's time model (#35): the work the trace counts is exact (FLOPs from shapes,
bytes of the optimizer step, bytes sent by DDP/FSDP2), the step time orders what costs
more above what costs less, and the recommendation weighs it. Times are never asserted
against a clock: the suite plans with a fixed CPU profile (tests/conftest.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from memfit.config.overrides import with_overrides
from memfit.config.schema import MemoryConfig
from memfit.plan import estimate
from memfit.plan.choose import StrategyEstimate
from memfit.plan.ladder import KEEP_STATE, fastest_rung
from memfit.plan.planned_device import planned_device
from memfit.plan.planner import load_plan_config, plan
from memfit.plan.search import with_fitted
from memfit.plan.step_time import device_seconds, rate, step_time
from memfit.plan.strategies import rungs, strategies
from memfit.plan.trace import trace_micro_batch
from memfit.techniques import checkpointing
from memfit.techniques.optimizers import OptimizerSetting
from memfit.techniques.optimizers.step_work import ADAMW8BIT
from memfit.techniques.work import size_class

PROFILE = planned_device("cpu").profile


def traced_work(model: nn.Module, batch: dict, dtype: torch.dtype = torch.float32):
    """The work of one forward + backward of ``model`` on fake tensors shaped as ``batch``."""
    with torch.device("meta"):
        model = model.to("meta")

    def make_batch() -> dict:
        return {name: torch.empty(shape, dtype=dtype) for name, shape in batch.items()}

    return trace_micro_batch(model, make_batch, lambda m, b: m(**b).sum(), None, False).work


class Blocks(nn.Module):
    def __init__(self, sizes: list[int]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(a, b, bias=False)
                                    for a, b in zip(sizes, sizes[1:], strict=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_matmul_flops_are_counted_exactly_by_dtype_and_smallest_side():
    # [8, 64] @ [64, 32]: forward 2*8*64*32; backward: the weight's grad only (the input
    # needs none), 2*32*8*64.
    work = traced_work(Blocks([64, 32]), {"x": (8, 64)})
    assert work.flops == 2 * (2 * 8 * 64 * 32)
    assert set(k for k in work.amounts if k[0] == "matmul") == {("matmul", "float32",
                                                                  size_class(8))}
    # Two blocks: the second's input needs a grad, one matmul more.
    two = traced_work(Blocks([64, 32, 16]), {"x": (8, 64)})
    assert two.flops == 2 * (2 * 8 * 64 * 32) + 3 * (2 * 8 * 32 * 16)


class MLPBlocks(nn.Module):
    def __init__(self, blocks: int, width: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width, bias=False), nn.ReLU(),
                          nn.Linear(width, width, bias=False)) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_checkpointing_adds_exactly_the_recomputation_backward_needs():
    plain = traced_work(MLPBlocks(3, 64), {"x": (8, 64)})
    model = checkpointing.apply(MLPBlocks(3, 64), MemoryConfig(gradient_checkpointing=True),
                                False)
    recomputed = traced_work(model, {"x": (8, 64)})
    # Non-reentrant checkpointing stops recomputing once backward has what it saves: each
    # block's first matmul and ReLU (the second matmul's saved input), not the second.
    assert recomputed.flops - plain.flops == 3 * (2 * 8 * 64 * 64)
    assert recomputed.launches > plain.launches


class Attention(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.weight = nn.Parameter(torch.ones(1))

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        q = q * self.weight
        return nn.functional.scaled_dot_product_attention(q, q, q, is_causal=self.causal)


def test_causal_attention_is_half_the_flops_of_full():
    full = traced_work(Attention(False), {"q": (1, 2, 128, 32)})
    causal = traced_work(Attention(True), {"q": (1, 2, 128, 32)})
    assert full.flops > 0 and causal.flops == full.flops // 2


class DropoutBlocks(Blocks):
    def __init__(self, sizes: list[int]) -> None:
        super().__init__(sizes)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.dropout(x))


def test_values_of_arithmetic_bound_ops_are_counted_and_priced_by_the_profile():
    # Dropout on [8, 64] draws one random value per element (bernoulli_ on CPU).
    work = traced_work(DropoutBlocks([64, 32]), {"x": (8, 64)})
    assert work.amounts[("elements", "bernoulli_", 0)] == 8 * 64
    plain = dataclasses.replace(PROFILE, element_seconds={})
    priced = dataclasses.replace(PROFILE, element_seconds={"bernoulli_": 1e-6})
    assert device_seconds(work, priced) - device_seconds(work, plain) == pytest.approx(
        8 * 64 * 1e-6)
    # The 8-bit AdamW update files its parameter values for the profile to price.
    update = ADAMW8BIT.of(1000)
    assert update.amounts[("elements", "adamw8bit", 0)] == 1000
    assert update.memory_bytes == 4 * 4 * 1000  # its bytes as before: 4 passes
    assert "adamw8bit" in PROFILE.element_seconds  # the suite's profile prices it


class ReluBlocks(Blocks):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(super().forward(x))


def test_element_wise_ops_in_bf16_are_priced_by_the_bf16_table():
    # A bf16 ReLU on [8, 64]: 2 x 1 KiB moved (read, written); bf16 matmuls stay matmuls.
    model = ReluBlocks([64, 64]).to(torch.bfloat16)
    work = traced_work(model, {"x": (8, 64)}, torch.bfloat16)
    narrow = {key: amount for key, amount in work.amounts.items()
              if key[0] == "memory" and key[1] == "bfloat16"}
    assert narrow and all(key[1] in ("", "bfloat16") for key in work.amounts
                          if key[0] == "memory")
    plain = dataclasses.replace(PROFILE, memory_by_dtype={})
    slow = dataclasses.replace(PROFILE, memory_by_dtype={"bfloat16": ((1.0, 1e6),)})
    extra = sum(amount / 1e6 for amount in narrow.values()) - sum(
        amount / rate(PROFILE.memory, 1.5 * 2.0**key[2]) for key, amount in narrow.items())
    assert device_seconds(work, slow) - device_seconds(work, plain) == pytest.approx(extra)


def tiny(*overrides: str):
    return load_plan_config(None, ["model.preset=tiny-llama", "data.max_length=32", *overrides])


def test_each_optimizer_spec_owns_its_step_work():
    numel = sum(p.numel for p in estimate_params(tiny()))
    adamw = estimate(tiny("optimizer.name=adamw"), "cpu").work.optimizer
    sgd = estimate(tiny("optimizer.name=sgd"), "cpu").work.optimizer
    assert adamw.memory_bytes == 20 * 4 * numel  # step_work.ADAMW: 20 passes
    assert sgd.memory_bytes == 3 * 4 * numel
    galore = estimate(tiny("optimizer.name=galore"), "cpu").work.optimizer
    assert galore.flops > 0  # its projections and refresh


def test_galores_gradients_projected_in_backward_replace_the_full_weight_gradients():
    # update_gap 2: one step in two keeps P and takes R = P^T G from backward.
    options = ["optimizer.name=galore", "optimizer.galore.rank=4",
               "optimizer.galore.update_gap=2", "precision=fp32"]
    config = tiny(*options)
    tokens = config.train.micro_batch_size * 32
    linear = [p for p in estimate_params(config) if p.projected and p.linear_weight]
    assert linear  # the tiny Llama's attention and MLP weights
    full = sum(2 * tokens * out * inputs for out, inputs in (p.shape for p in linear))
    projected = sum(2 * tokens * 4 * (out + inputs) for out, inputs in (p.shape for p in linear))
    galore = estimate(config, "cpu").work.micro_batch
    traced = estimate(tiny(*options, "optimizer.galore.project_in_backward=false"),
                      "cpu").work.micro_batch
    assert traced.flops - galore.flops == full // 2 - projected // 2


def estimate_params(config):
    from memfit.plan import meta
    from memfit.plan.costs import trainable_params

    model = meta.build(meta.BuildInputs.of(config, "cuda")).model
    return trainable_params(model, OptimizerSetting.of(config))


def test_ddp_and_fsdp_send_the_bytes_of_their_ring_collectives():
    config = tiny("adapter.kind=none", "train.gradient_accumulation_steps=2")
    grads = sum(p.nbytes for p in estimate_params(config))
    ddp = estimate(with_overrides(config, {"distributed.strategy": "ddp",
                                           "distributed.nproc": 4}), "cpu").work.collectives
    assert ddp.bytes == int(2 * 3 / 4 * grads)  # one all-reduce per step, under no_sync
    fsdp_config = with_overrides(config, {"distributed.strategy": "fsdp", "distributed.nproc": 2})
    fsdp = estimate(fsdp_config, "cpu")
    assert fsdp.work.collectives.calls > ddp.calls  # three per unit per micro-batch
    assert fsdp.work.collectives.bytes > ddp.bytes
    single = estimate(config, "cpu").work.collectives
    assert (single.bytes, single.calls) == (0, 0)


def test_dequantizing_a_4bit_base_and_offload_cost_time():
    lora = estimate(tiny("adapter.kind=lora"), "cpu")
    qlora = estimate(tiny("adapter.kind=qlora"), "cpu")
    assert qlora.work.micro_batch.memory_bytes > lora.work.micro_batch.memory_bytes
    offload = estimate(tiny("adapter.kind=lora", "memory.activation_offload=true"), "cpu")
    assert offload.work.micro_batch.host_copy > 0
    timed = step_time(offload.work, PROFILE)
    assert timed.parts["offload"] > 0
    assert timed.seconds > step_time(lora.work, PROFILE).seconds


def test_tokens_per_second_count_every_token_of_the_step():
    config = tiny("train.micro_batch_size=2", "train.gradient_accumulation_steps=3")
    timed = step_time(estimate(config, "cpu").work, PROFILE)
    assert timed.tokens == 2 * 3 * 32
    assert timed.tokens_per_second == pytest.approx(timed.tokens / timed.seconds)


def test_every_row_has_a_step_time_and_the_choice_is_its_methods_fastest_mix():
    result = plan(tiny(), "64MiB", device="cpu")
    assert all(row.time.seconds > 0 for row in result.strategies)
    chosen = next(r for r in result.strategies if r.name == result.recommended)
    same = [r for r in result.strategies if r.method == chosen.method and r.fits]
    assert result.recommended_time.seconds <= min(r.time.seconds for r in same)
    assert "per optimizer step" in result.reason


def test_prefer_speed_takes_the_fastest_row_of_the_configs_adapter_kind():
    result = plan(tiny("adapter.kind=lora"), "64MiB", device="cpu", prefer="speed")
    chosen = next(r for r in result.strategies if r.name == result.recommended)
    assert chosen.overrides["adapter.kind"] == "lora"
    lora = [r for r in result.strategies if r.fits and r.overrides["adapter.kind"] == "lora"]
    assert result.recommended_time.seconds <= min(r.time.seconds for r in lora)
    anything = plan(tiny("adapter.kind=lora"), "64MiB", device="cpu", prefer="speed",
                    any_method=True)
    assert anything.recommended_time.seconds <= min(
        r.time.seconds for r in anything.strategies if r.fits)


def test_a_fit_row_checkpoints_the_fewest_blocks_that_fit(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(tmp_path)
    config = load_plan_config(None, [f"model.path={tmp_path}", "data.max_length=256",
                                     "train.micro_batch_size=4"])
    levels = [(name, overrides) for name, overrides in
              strategies(chunked_loss_ok=True, tiled_mlp_ok=True) if name.startswith("lora")]
    needs = {name: estimate(with_overrides(config, overrides), "cpu")
             for name, overrides in levels}
    budget = (needs["lora"].device_bytes + needs["lora+ckpt"].device_bytes) // 2
    rows = [StrategyEstimate(name, overrides, needs[name], needs[name].device_bytes <= budget,
                             step_time(needs[name].work, PROFILE)) for name, overrides in levels]
    searched = with_fitted(config, rows, budget, "cpu", PROFILE, None)
    assert [r.name for r in searched] == ["lora", "lora+ckpt", "lora+offload", "lora+fit"]
    fitted = searched[-1]
    ckpt = needs["lora+ckpt"]
    blocks = fitted.overrides["memory.checkpoint_blocks"]
    assert 0 < blocks < 8 and fitted.fits
    assert fitted.time.seconds < step_time(ckpt.work, PROFILE).seconds
    fewer = estimate(with_overrides(config, {**fitted.overrides,
                                             "memory.checkpoint_blocks": blocks - 1}), "cpu")
    assert fewer.device_bytes > budget  # one block fewer does not fit


def test_the_oom_ladder_takes_the_fastest_rung_that_fits_and_keeps_the_state():
    config = tiny("adapter.kind=none", "train.micro_batch_size=4")
    given = estimate(config, "cpu").device_bytes
    chosen = fastest_rung(config, given - 1, "cpu")
    assert set(chosen) <= KEEP_STATE
    timed = {}
    for overrides in rungs(config):
        needs = estimate(with_overrides(config, overrides), "cpu")
        if set(overrides) <= KEEP_STATE and needs.device_bytes < given:
            timed[str(overrides)] = step_time(needs.work, PROFILE).seconds
    assert timed[str(chosen)] == min(timed.values())
    # Nothing planned to fit: the ladder's next rung, in its order.
    assert fastest_rung(config, 1, "cpu") == rungs(config)[0]


def test_a_row_is_a_strategy_estimate_with_its_method():
    row = plan(tiny(), "64MiB", device="cpu").strategies[1]
    assert isinstance(row, StrategyEstimate) and row.name == "full-adamw+ckpt"
    assert row.method == "full-adamw"
    assert dataclasses.replace(row, name="ddp:lora+fit").method == "lora"
