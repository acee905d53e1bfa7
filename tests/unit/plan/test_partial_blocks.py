"""memory.checkpoint_blocks and memory.offload_blocks on tiny Llamas of 2, 4 and 8 layers
(random weights, 2 x 64 tokens), trained for real on CPU under the tensor tracker: exactly
the first N blocks are checkpointed, the losses are the unchanged run's, the activations
(checkpointing) and host bytes (offload) lie between the all and none levels, and the plan
is at or above the measurement at every N (8 layers: planned from 2- and 3-layer stand-ins
of each kind of block)."""

from __future__ import annotations

import pytest
from accuracy_cases import config_for, measure_steps, tiny_llama_folder

from memfit.plan import estimate
from memfit.techniques import checkpointing
from memfit.training.build import build_run

STEPS = 2  # the second step holds the optimizer state from the first


def tiny_llama(folder, corpus, layers: int, memory: dict):
    return config_for({"model": {"path": str(tiny_llama_folder(folder, layers))},
                       "data": {"path": str(corpus), "format": "text", "max_length": 64,
                                "eval_fraction": 0.0}},
                      {"optimizer": {"name": "adamw"}, "memory": memory})


def counts(layers: int) -> list[int]:
    return sorted({0, 1, 2, layers})


@pytest.mark.parametrize("layers", [2, 4, 8])
def test_checkpoint_blocks(folder, corpus, layers):
    unchanged = measure_steps(tiny_llama(folder, corpus, layers, {}), STEPS)
    activations = []
    for blocks in counts(layers):
        config = tiny_llama(folder, corpus, layers, {"gradient_checkpointing": True,
                                                     "checkpoint_blocks": blocks})
        assert checkpointing.checkpointed_blocks(build_run(config).model) == blocks
        measured = measure_steps(config, STEPS)
        assert measured.losses == unchanged.losses  # recomputing changes no value
        planned = estimate(config, device="cpu").peak_tensor_bytes
        assert planned >= measured.peak.peak_bytes, (blocks, planned, measured.peak.peak_bytes)
        activations.append(measured.peak.by_category["activations"])
    # None checkpointed keeps the most, all the least, and each block more saves some.
    assert activations == sorted(activations, reverse=True) and len(set(activations)) > 1


@pytest.mark.parametrize("layers, memory", [
    (2, {}), (8, {}), (4, {"gradient_checkpointing": True}),  # with it: the blocks' inputs
])
def test_offload_blocks(folder, corpus, layers, memory):
    host = []
    for blocks in counts(layers):
        config = tiny_llama(folder, corpus, layers, {**memory, "activation_offload": True,
                                                     "offload_blocks": blocks})
        measured = measure_steps(config, STEPS)
        plan = estimate(config, device="cpu")
        assert plan.peak_tensor_bytes >= measured.peak.peak_bytes, (blocks, plan, measured)
        assert plan.host_bytes >= measured.host_peak_bytes, (blocks, plan, measured)
        host.append(measured.host_peak_bytes)
    assert host[0] == 0 and host == sorted(set(host))  # each block more offloads more
