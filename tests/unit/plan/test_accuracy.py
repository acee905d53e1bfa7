"""The plan against tensor bytes measured while really training on CPU (the tracker)."""

from __future__ import annotations

import pytest
from accuracy_cases import cases, measure_peak_bytes, write_data

from memfit.plan import estimate

# One strategy per architecture plus the cases with the most structure (checkpointing,
# accumulation, 8-bit state); benchmarks/plan_accuracy.py runs the whole matrix.
CHOSEN = {("llama", "lora-checkpointing"), ("gpt2", "adafactor"),
          ("bert-encoder", "adamw8bit"), ("conv-autoencoder", "adamw-accumulate")}


@pytest.fixture(scope="module")
def chosen_cases(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan-accuracy")
    data = write_data(folder)
    return {(arch, name): (config, example)
            for arch, name, config, example in cases(data, folder) if (arch, name) in CHOSEN}


@pytest.mark.parametrize("case", sorted(CHOSEN), ids="-".join)
def test_plan_matches_measured_peak(chosen_cases, case):
    config, example = chosen_cases[case]
    planned = estimate(config, device="cpu", example_batch=example).peak_tensor_bytes
    measured = measure_peak_bytes(config)
    assert abs(planned / measured - 1) <= 0.07, (planned, measured)
