"""memory.freeze_blocks, the technique a stranger adds on the first N blocks (its own key in
its spec, a BlockRule for the planner): on tiny Llamas of 2, 4, 8 and 12 layers (random
weights, 2 x 64 tokens), trained for real on CPU under the tensor tracker, exactly the first
N blocks are frozen, the optimizer state shrinks with N, and the plan is at or above the
measured peak at every N and depth (deeper than 4 layers: planned from 2- and 3-layer
stand-ins of frozen and of trained blocks). Before frozen blocks were a kind of their own,
a model planned from stand-ins of one kind came out below the measured peak from N = 3.

~20 s: 11 runs of 2 steps, the depths the issue names, each planned as well."""

from __future__ import annotations

import pytest
from accuracy_cases import config_for, measure_steps, tiny_llama_folder

from memfit._utils.errors import ConfigError
from memfit.config.ignored import IgnoredKeyWarning
from memfit.plan import estimate
from memfit.techniques import registry
from memfit.techniques.blocks import transformers_layers
from memfit.techniques.own_keys import defaults
from memfit.training.build import build_run

STEPS = 2  # the second step holds the optimizer state from the first


def tiny_llama(folder, corpus, layers: int, memory: dict, **sections):
    return config_for({"model": {"path": str(tiny_llama_folder(folder, layers))},
                       "data": {"path": str(corpus), "format": "text", "max_length": 64,
                                "eval_fraction": 0.0}},
                      {"optimizer": {"name": "adamw"}, "memory": memory, **sections})


@pytest.mark.parametrize("layers", [2, 4, 8, 12])
def test_the_first_n_blocks_are_frozen_and_planned_at_or_above_the_measurement(
        folder, corpus, layers):
    states = []
    for frozen in sorted({1, min(3, layers), layers}):
        config = tiny_llama(folder, corpus, layers, {"freeze_blocks": frozen})
        blocks = transformers_layers(build_run(config).model)
        assert [not any(p.requires_grad for p in block.parameters()) for block in blocks] == [
            index < frozen for index in range(layers)]
        measured = measure_steps(config, STEPS)
        planned = estimate(config, device="cpu").peak_tensor_bytes
        assert planned >= measured.peak.peak_bytes, (frozen, planned, measured.peak.peak_bytes)
        assert planned <= 1.15 * measured.peak.peak_bytes, (frozen, planned)
        states.append(measured.peak.by_category["optimizer"])
    assert states == sorted(states, reverse=True) and len(set(states)) == len(states)


def test_its_key_is_checked_at_load_and_ignored_with_adapters(folder, corpus):
    with pytest.raises(ConfigError, match=r"memory.freeze_blocks=1.5 as a fraction"):
        tiny_llama(folder, corpus, 2, {"freeze_blocks": 1.5})
    with pytest.raises(ConfigError, match=r"memory.freeze_blocks=-1 is outside 0 to "):
        tiny_llama(folder, corpus, 2, {"freeze_blocks": -1})
    with pytest.raises(ConfigError, match=r"did you mean memory.freeze_blocks\?"):
        tiny_llama(folder, corpus, 2, {"freeze_block": 1})
    with pytest.warns(IgnoredKeyWarning, match="memory.freeze_blocks=1 is ignored: "
                                               "adapter.kind=lora freezes every base weight"):
        tiny_llama(folder, corpus, 2, {"freeze_blocks": 1}, adapter={"kind": "lora"})
    with pytest.raises(ConfigError, match="memory.freeze_blocks=3 is beyond the 2 blocks"):
        build_run(tiny_llama(folder, corpus, 2, {"freeze_blocks": 3}))


def test_every_own_key_a_strategy_row_resets_defaults_to_null():
    """config.limits.lookup reads an own key that is not given as None: what row_reset puts
    back must be that default."""
    for spec in registry.TECHNIQUES:
        declared = defaults(spec.own)
        for key in spec.row_reset:
            if key.removeprefix("memory.") in declared:
                assert declared[key.removeprefix("memory.")] is None, (spec.name, key)
