"""The planner's peak moments: what each contributor (the trace, the optimizer's spec, the
distribution strategy's spec) names, the one that sets the peak, and docs/planner.md's list
of them. Built from hand-made StepBytes (no trace), then checked on planned configs."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from memfit.config.schema import Config
from memfit.plan import estimate, with_overrides
from memfit.plan.moments import peak, step_moments
from memfit.plan.planner import load_plan_config
from memfit.techniques.moments import Moment, OptimizerCost, StepBytes
from memfit.techniques.optimizers import OptimizerSetting
from memfit.techniques.technique_options import TechniqueOptions

DOCS = Path(__file__).resolve().parents[3] / "docs" / "planner.md"



def moments_of(step: StepBytes, config: Config) -> list[Moment]:
    return step_moments(step, OptimizerSetting.of(config), TechniqueOptions.of(config))

def split(grads: int, activations: int, temporaries: int) -> dict[str, int]:
    return {"weights": 7, "grads": grads, "optimizer": 0, "activations": activations,
            "temporaries": temporaries}


def step_bytes(config: Config, first_grads: int = 0) -> StepBytes:
    """Numbers picked so that every moment differs from every other."""
    ddp = config.distributed.strategy.value == "ddp" and not config.optimizer.layerwise
    return StepBytes(first_micro_batch=split(first_grads, 1000, 300), forward=split(0, 1000, 200),
                     backward=split(40, 600, 250), grads=100, largest_grad=30, inputs=5,
                     optimizer=OptimizerCost(200, 70, 20, 9), devices=1,
                     gathered=config.distributed.strategy.value == "fsdp",
                     buckets=90 if ddp else 0, beside_hook=11, host_is_device=True)


def variants() -> list[Config]:
    base = load_plan_config(None, ["model.preset=tiny-llama"])
    return [with_overrides(base, {"optimizer.layerwise": layerwise,
                                  "train.gradient_accumulation_steps": accumulation,
                                  "memory.optimizer_offload": offload,
                                  "distributed.strategy": strategy, "distributed.nproc": 2})
            for layerwise, accumulation, offload, strategy in itertools.product(
                (False, True), (1, 2), (False, True), ("none", "ddp", "fsdp"))] + [
        with_overrides(base, {"adapter.kind": "qlora"})]


def documented() -> set[str]:
    """The moment column of the table in docs/planner.md's "Peak moments" section."""
    section = DOCS.read_text().split("## Peak moments", 1)[1].split("\n## ", 1)[0]
    return {row.split("|")[2].strip() for row in section.splitlines()
            if row.startswith("| ") and not row.startswith(("| contributor", "|---"))}


def test_docs_list_exactly_the_moments_the_contributors_name():
    named = {moment.name for config in variants() for grads in (0, 40)
             for moment in moments_of(step_bytes(config, grads), config)}
    assert named == documented()


def test_each_contributor_adds_its_moments_with_their_bytes():
    def names(*overrides: str) -> list[str]:
        config = load_plan_config(None, ["model.preset=tiny-llama", *overrides])
        return [moment.name for moment in moments_of(step_bytes(config), config)
                if moment.name not in ("evaluation", "saving")]  # every run's: below

    assert names() == ["first micro-batch's forward", "optimizer step"]
    assert names("train.gradient_accumulation_steps=2") == [
        "first micro-batch's forward", "later micro-batch", "optimizer step"]
    # Layer-wise updates replace the trace's moments; DDP does not wrap the model then.
    assert names("optimizer.layerwise=true", "distributed.strategy=ddp",
                 "distributed.nproc=2") == ["layer-wise update in backward",
                                            "forward before layer-wise updates"]
    assert names("distributed.strategy=ddp", "distributed.nproc=2")[-2:] == [
        "first micro-batch beside DDP's buckets", "DDP bucket rebuild"]
    assert names("distributed.strategy=fsdp", "distributed.nproc=2")[-2:] == [
        "FSDP2 forward", "FSDP2 backward, grads divided"]
    config = load_plan_config(None, ["model.preset=tiny-llama", "optimizer.layerwise=true",
                                     "train.gradient_accumulation_steps=2"])
    in_backward, forward = moments_of(step_bytes(config), config)[:2]
    # The largest grad and those whole beside it; backward's activations; its temporaries,
    # one parameter's step scratch and the accumulation buffers.
    assert in_backward.bytes == {"grads": 30 + 11, "activations": 600,
                                 "temporaries": 250 + 20 + 9}
    assert forward.bytes == {"grads": 0, "activations": 1000, "temporaries": 200 + 9}
    config = load_plan_config(None, ["model.preset=tiny-llama", "distributed.strategy=ddp",
                                     "distributed.nproc=2", "train.gradient_accumulation_steps=2"])
    by_name = {m.name: m for m in moments_of(step_bytes(config), config)}
    # The later micro-batch (100 grads + the forward's 1200 + 30 being added) is below the
    # first micro-batch with every bucket (90 + 1300), so it bounds the first one too.
    assert by_name["later micro-batch"].total == 100 + 1200 + 30
    assert by_name["first micro-batch beside DDP's buckets"].bytes == \
        by_name["later micro-batch"].bytes
    assert by_name["DDP bucket rebuild"].bytes == {"grads": 180, "activations": 5,
                                                   "temporaries": 0}
    assert by_name["optimizer step"].bytes == {"grads": 100, "activations": 5, "temporaries": 70}


def test_the_peak_is_the_largest_moment_and_the_first_of_equal_ones():
    small, large, also_large = (Moment(name, {"grads": grads}, "why")
                                for name, grads in (("a", 1), ("b", 5), ("c", 5)))
    assert peak([small, large, also_large]) is large


@pytest.mark.parametrize("overrides, name", [
    ({}, "first micro-batch's forward"),  # one process: the end of forward, no grad yet
    ({"distributed.strategy": "ddp", "distributed.nproc": 2},
     "first micro-batch beside DDP's buckets"),
    ({"optimizer.layerwise": True}, "layer-wise update in backward"),
    ({"train.gradient_accumulation_steps": 2}, "later micro-batch"),
])
def test_the_estimate_names_the_moment_whose_bytes_it_splits(overrides: dict, name: str):
    config = load_plan_config(None, ["model.preset=tiny-llama", "data.max_length=64",
                                     "train.micro_batch_size=1"])
    planned = estimate(with_overrides(config, overrides), "cpu")
    assert planned.peak_moment.name == name
    assert planned.peak_moment.bytes == {category: planned.bytes[category]
                                         for category in planned.peak_moment.bytes}
    assert re.fullmatch(r"[^\n]+", planned.peak_moment.why)  # one line


def test_the_run_around_the_steps_and_loading_a_quantized_base_are_moments():
    config = load_plan_config(None, ["model.preset=tiny-llama"])
    step = step_bytes(config)
    by_name = {m.name: m for m in moments_of(step, config)}
    assert by_name["saving"].bytes["temporaries"] == step.grads  # what trains, copied once
    assert by_name["evaluation"].bytes["grads"] == 0
    qlora = with_overrides(config, {"adapter.kind": "qlora"})
    assert "quantizing the base" in {m.name for m in moments_of(step_bytes(qlora), qlora)}
    assert "quantizing the base" not in by_name


def test_a_built_base_is_quantized_on_the_host_before_it_is_placed():
    # A preset is built whole in model.dtype and quantized before it is placed: on a CPU
    # device that is device memory (every quantized layer in bf16, and more); a GPU never
    # holds it. A folder is quantized onto the device while it loads (its largest layer).
    from memfit.plan import meta
    from memfit.techniques.quantize_stand_in import QuantizedLinear, quantizing_bytes

    config = load_plan_config(None, ["model.preset=tiny-llama", "adapter.kind=qlora",
                                     "model.dtype=bfloat16"])
    model = meta.build(meta.BuildInputs.of(config, "cpu")).model
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert layers
    every_layer = sum(2 * m.in_features * m.out_features for m in layers)  # bf16
    options = TechniqueOptions.of(config)
    assert quantizing_bytes(model, options, "cpu") >= every_layer
    assert quantizing_bytes(model, options, "cuda") == 0
