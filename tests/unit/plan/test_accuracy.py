"""The plan against tensor bytes measured while really training on CPU (the tracker)."""

from __future__ import annotations

import statistics

import pytest
from accuracy_cases import (
    HF_DECODERS,
    PROJECTORS,
    RANK_8,
    STRATEGIES,
    TECHNIQUE_CASES,
    cases,
    config_for,
    measure_peak,
    measure_peak_bytes,
    write_data,
)

from memfit.plan import estimate
from memfit.techniques import registry
from memfit.techniques.optimizers import SPECS as OPTIMIZER_SPECS

# One strategy per architecture plus the cases with the most structure (checkpointing,
# accumulation, 8-bit state); benchmarks/plan_accuracy.py runs the whole matrix.
CHOSEN = {("llama", "lora-checkpointing"), ("gpt2", "adafactor"),
          ("bert-encoder", "adamw8bit"), ("conv-autoencoder", "adamw-accumulate")}
# A bitsandbytes base (NF4 from the compute dtype, NF4 and int8 from an fp32 folder, with
# checkpointing): its layers return fp32 for the fp32 residual stream under bf16 autocast
# and dequantize to fp32 in backward (the planner once assumed bf16 and fell 11-15% short).
QUANTIZED = {("llama", "qlora"), ("llama-wide", "qlora"), ("llama-wide", "qlora-int8"),
             ("llama-wide", "qlora-checkpointing")}


# Each optimizer's spec against the optimizer: every GaLore projector where its step is
# the peak (SVDs of 256 x 1024 matrices, APOLLO's full-size scaled gradient), a
# galore.modules subset on GPT-2's Conv1D layers, layer-wise updates accumulating full
# gradients on refresh steps, and the chunked-loss, tiled-MLP and pure-bf16 techniques.
SPECS = {*(("llama-wide", f"galore-{projector}") for projector in PROJECTORS),
         ("gpt2", "galore-mlp-only"), ("llama-wide", "galore-layerwise-full-gradient"),
         ("gpt2", "adamw-layerwise"), ("llama", "chunked-loss"), ("llama", "tiled-mlp"),
         ("llama", "bf16-pure"),
         # every technique whose spec brings its own case
         *(("llama", slug) for slug in TECHNIQUE_CASES),
         # every registered optimizer without a case above (a new one included)
         *(("llama", name) for name in OPTIMIZER_SPECS
           if name in STRATEGIES and name not in ("adamw", "adamw8bit", "adafactor"))}
# Offload measured on CPU: the copies live in host-tagged storage the tracker keeps apart.
OFFLOADS = {("llama", "adamw-optimizer-offload"), ("llama", "adamw-activation-offload"),
            ("llama", "lora-checkpointing-activation-offload")}


@pytest.fixture(scope="module")
def chosen_cases(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan-accuracy")
    data = write_data(folder)
    return {(arch, name): (config, example) for arch, name, config, example
            in cases(data, folder) if (arch, name) in CHOSEN | QUANTIZED | SPECS | OFFLOADS}


@pytest.mark.parametrize("case", sorted(CHOSEN), ids="-".join)
def test_plan_matches_measured_peak(chosen_cases, case):
    config, example = chosen_cases[case]
    planned = estimate(config, device="cpu", example_batch=example).peak_tensor_bytes
    measured = measure_peak_bytes(config)
    assert abs(planned / measured - 1) <= 0.07, (planned, measured)


@pytest.mark.parametrize("case", sorted(QUANTIZED), ids="-".join)
def test_qlora_plan_is_not_below_measured_peak(chosen_cases, case):
    """An under-estimate is the unsafe direction: auto-fit would pick a setting that runs
    out of memory, so the plan must not be below the tracker's exact bytes."""
    config, example = chosen_cases[case]
    planned = estimate(config, device="cpu", example_batch=example).peak_tensor_bytes
    measured = measure_peak_bytes(config)
    assert 0 <= planned / measured - 1 <= 0.03, (planned, measured)


@pytest.mark.parametrize("case", sorted(SPECS), ids="-".join)
def test_optimizer_and_technique_plans_are_safe_and_close(chosen_cases, case):
    """The done-when of the one-spec-per-optimizer work: at or above the tracker's exact
    bytes (auto-fit relies on it) and within 15%."""
    config, example = chosen_cases[case]
    planned = estimate(config, device="cpu", example_batch=example).peak_tensor_bytes
    measured = measure_peak_bytes(config)
    assert 0 <= planned / measured - 1 <= 0.15, (planned, measured)


@pytest.mark.parametrize("case", sorted(OFFLOADS), ids="-".join)
def test_offload_plans_are_safe_and_close_on_device_and_host(chosen_cases, case):
    """Each offload's saving measured, not assumed: the device peak and the host pool's
    peak each at or above the tracker's exact bytes and within 15%."""
    config, example = chosen_cases[case]
    plan = estimate(config, device="cpu", example_batch=example)
    peak, host = measure_peak(config)
    device = peak.peak_bytes
    assert host > 0
    assert 0 <= plan.peak_tensor_bytes / device - 1 <= 0.15, (plan.peak_tensor_bytes, device)
    assert 0 <= plan.host_bytes / host - 1 <= 0.15, (plan.host_bytes, host)


# GPT-NeoX, Qwen2 and Phi-3 folders (fp32, 2 x 128 tokens) with rank-8 adapters on every
# linear layer: LoRA, LoRA with checkpointing, and a base quantized while loading (NF4 from
# bf16 or fp32, int8, NF4 with checkpointing). The QLoRA plan was up to 4.8% below the
# tracker (Phi-3, NF4 under bf16 autocast) while PEFT's bitsandbytes wrappers' copies of
# each layer's output went uncounted (plan/meta.py, _as_peft_quantized_layers).
DECODER_CASES = sorted((arch, name) for arch in HF_DECODERS for name in STRATEGIES
                       if name.startswith(RANK_8))


@pytest.fixture(scope="module")
def decoder_errors(tmp_path_factory):
    """(arch, strategy) -> (planned, measured): every decoder case, measured once, so the
    median below is over all of them."""
    folder = tmp_path_factory.mktemp("plan-accuracy-decoders")
    data = write_data(folder)
    return {(arch, name): (estimate(config, device="cpu",
                                    example_batch=example).peak_tensor_bytes,
                           measure_peak_bytes(config))
            for arch, name, config, example in cases(data, folder)
            if (arch, name) in DECODER_CASES}


@pytest.mark.parametrize("case", DECODER_CASES, ids="-".join)
def test_decoder_adapter_plans_are_safe_and_close(decoder_errors, case):
    """At or above the tracker's exact bytes (auto-fit relies on it) and within 15%; without
    checkpointing (planned 1.4-4.1% above here, not looked into) the trace runs the ops
    training runs and is within 1%."""
    planned, measured = decoder_errors[case]
    bound = 0.15 if case[1].endswith("checkpointing") else 0.01
    assert 0 <= planned / measured - 1 <= bound, (planned, measured)


def test_decoder_adapter_plans_median_error(decoder_errors):
    errors = [planned / measured - 1 for planned, measured in decoder_errors.values()]
    assert len(errors) == len(DECODER_CASES)
    assert statistics.median(errors) <= 0.05, errors


def test_every_registered_technique_has_a_measured_case():
    """A technique added to techniques/registry.py fails here until a strategy of
    accuracy_cases.STRATEGIES that turns it on is measured by one of the tests above (its
    strategy's overrides on the tiny Llama decide whether it is on)."""
    measured = {name for _, name in CHOSEN | QUANTIZED | SPECS | OFFLOADS | set(DECODER_CASES)}
    llama = {"model": {"preset": "tiny-llama"},
             "data": {"path": "corpus.txt", "format": "text", "eval_fraction": 0.0}}
    configs = [config_for(llama, STRATEGIES[name]) for name in sorted(measured)]
    missing = [spec.name for spec in registry.TECHNIQUES
               if not any(spec.enabled(registry.TechniqueOptions.of(config)) for config in configs)]
    assert not missing, f"no measured plan-accuracy case turns on: {missing}"
