"""Sequence parallelism in the plan (#37 item 2): one rank of a sequence group is traced as
training runs it (distributed/sequence_parallel.py), its all-to-alls allocating their
outputs and counting what they send; the plan of 2 processes sharing each sequence holds
about half the activations of one, and over several devices the split is planned where
nothing else fits. ``benchmarks/long_context.py`` measures it against 2 real processes
(planned = measured activations at 2,048 tokens)."""

from __future__ import annotations

import pytest

from memfit.models.presets import tiny_llama
from memfit.plan import estimate, plan, with_overrides
from memfit.plan.planner import load_plan_config
from memfit.plan.sequence_rows import widest_split

TINY = ["model.preset=tiny-llama", "train.micro_batch_size=1", "precision=fp32",
        "distributed.strategy=ddp", "distributed.nproc=2"]


def test_a_split_sequence_holds_about_half_and_counts_its_all_to_alls():
    length = 2048
    config = load_plan_config(None, [*TINY, f"data.max_length={length}",
                                     "memory.gradient_checkpointing=true"])
    whole = estimate(config, "cpu")
    split = estimate(with_overrides(config, {"distributed.sequence_parallel": 2}), "cpu")
    assert split.bytes["activations"] < 0.6 * whole.bytes["activations"]
    # The plan runs training's code, so this holds for training too: nothing (L, L) is
    # built for plain causal sequences (a transient 2 x 4 MiB causal mask was, before).
    assert split.peak_tensor_bytes < 0.6 * whole.peak_tensor_bytes
    assert split.work.tokens == whole.work.tokens // 2  # the group shares its sequences
    model = tiny_llama()
    head_dim = model.hidden_size // model.num_attention_heads
    # Each attention layer sends q, k, v and its output (fp32, this rank's 1,024 tokens)
    # half to the other rank: in forward, in the checkpointed forward's recompute, and
    # their gradients back in backward.
    per_layer = (2 * model.num_attention_heads + 2 * model.num_key_value_heads) * (
        length // 2) * head_dim * 4 // 2
    assert split.work.micro_batch.exchanges == 3 * 4 * model.num_hidden_layers
    assert split.work.micro_batch.exchanged == 3 * per_layer * model.num_hidden_layers
    assert whole.work.micro_batch.exchanges == whole.work.micro_batch.exchanged == 0


@pytest.mark.parametrize(("devices", "split"), [(1, 1), (2, 2), (4, 2), (3, 1)])
def test_the_widest_split_divides_the_devices_and_the_key_value_heads(devices, split):
    # tiny-llama: 4 heads, 2 key/value heads
    assert widest_split(load_plan_config(None, TINY).model, devices) == split


def test_over_two_devices_the_split_is_planned_only_where_nothing_else_fits():
    adapters_only = [*TINY, "memory.auto_keep_adapters=true"]  # fewer rows to trace
    tight = plan(load_plan_config(None, [*adapters_only, "data.max_length=296"]), "1MiB",
                 device="cpu", devices=2)
    split = [row for row in tight.strategies if row.name.startswith("fsdp-sp2:")]
    assert split and all(row.overrides["distributed.sequence_parallel"] == 2 for row in split)
    assert not any(row.fits for row in tight.strategies if row not in split)
    assert tight.recommended.startswith("fsdp-sp2:")
    assert tight.recommended_overrides["distributed.sequence_parallel"] == 2
    # Where something fits, no split row is planned: test_devices.py's
    # test_two_devices_plan_every_strategy_under_ddp_and_fsdp lists every row.
