"""Layer-wise plans count the activations alive when backward starts stepping parameters.

The trace's ``peak_without_grads`` once picked, as the trace ran, the moment a weight's
gradient was born (as a temporary: the most non-grad bytes so far); when that gradient was
then counted as a grad, the moment was no longer the peak, and the real one (end of
forward) had been passed over. With weights that outweigh the activations (a few tokens
through wide layers: the 69M Llama at 1 x 128 tokens) the end of backward won — weights
and grads only, 0 activations — and layer-wise plans (the trace without grads + one grad
+ one step) fell below the measured peak.
"""

from __future__ import annotations

import pytest
from accuracy_cases import config_for, measure_peak_bytes, wide_llama_folder, write_data

from memfit.plan import estimate, itemize
from memfit.plan.trace_inputs import TraceInputs

# Few tokens through wide layers: weight gradients outweigh the activations.
SHAPE = {"train": {"micro_batch_size": 1}}
LAYERWISE = {
    "galore-adafactor": {"optimizer": {"name": "galore", "layerwise": True,
                                       "galore": {"inner": "adafactor", "rank": 16}},
                         "precision": "bf16-pure"},
    "adamw-fp32": {"optimizer": {"name": "adamw", "layerwise": True}},
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan-layerwise")
    data = write_data(folder)
    return {"model": {"path": str(wide_llama_folder(folder))},
            "data": {"path": str(data["text"]), "format": "text", "max_length": 16,
                     "eval_fraction": 0.0}}


@pytest.mark.parametrize("name", sorted(LAYERWISE))
def test_peak_without_grads_holds_the_activations(base, name):
    config = config_for(base, {**LAYERWISE[name], **SHAPE})
    trace = itemize._trace(TraceInputs.of(config, "cpu"), None, None).trace
    without = trace.peak_without_grads
    assert without["activations"] > 0, without
    # Not the end of backward (every grad alive): the non-grad bytes peak while the
    # activations are alive, above the weights alone.
    assert without["grads"] < trace.peak["grads"], (without, trace.peak)
    assert sum(without.values()) - without["grads"] > without["weights"] + without["activations"]


def test_layerwise_plan_is_not_below_measured_peak(base):
    config = config_for(base, {**LAYERWISE["galore-adafactor"], **SHAPE})
    planned = estimate(config, device="cpu").peak_tensor_bytes
    measured = measure_peak_bytes(config)
    assert 0 <= planned / measured - 1 <= 0.07, (planned, measured)
