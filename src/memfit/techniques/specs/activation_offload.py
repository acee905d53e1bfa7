"""Activation offload (memory.activation_offload): training.step's forward and backward
inside techniques/activation_offload.py's ActivationOffload context; with
memory.offload_blocks, the chosen blocks (techniques/blocks.py) marked to offload while
they run, the rest of the model left on the device."""

from __future__ import annotations

from torch import nn

from memfit.config.ignored import Rule
from memfit.techniques import activation_offload, blocks
from memfit.techniques.blocks import offloaded, offloaded_everywhere
from memfit.techniques.specs.spec import BlockRule, Setting, TechniqueSpec


def apply(model: nn.Module, setting: Setting) -> nn.Module:
    """Mark the first memory.offload_blocks blocks; null marks none (the step's context
    then offloads every saved tensor, as without the key)."""
    memory = setting.options.memory
    if memory.offload_blocks is None:
        return model
    found = blocks.model_blocks(model, memory, setting.is_transformers)
    chosen = blocks.chosen_count("offload_blocks", memory.offload_blocks, len(found),
                                 blocks.model_named(setting.options.model))
    activation_offload.offload_in_blocks(found[:chosen])
    return model


SPEC = TechniqueSpec(
    name="activation offload",
    docs_row=("activation offload: saved activations kept in host memory between forward and "
              "backward"),
    keys=("memory.activation_offload", "memory.offload_blocks"),
    # The model stage, before the adapters: PEFT renames the modules memory.checkpoint_modules
    # names; the offload itself is the step's context.
    stage="model", enabled=lambda options: options.memory.activation_offload,
    plan="plan.trace counts saved tensors as host bytes, where training.step's "
         "ActivationOffload context keeps them; with memory.offload_blocks only inside the "
         "chosen blocks (plan/offload_in_blocks.py)",
    apply=apply, plan_apply=apply,
    row_reset=("memory.activation_offload", "memory.offload_blocks"), level="+offload",
    blocks=BlockRule(offloaded, offloaded_everywhere),
    ignored=(Rule(("memory.offload_blocks",), lambda c: not c.memory.activation_offload,
                  lambda c: "it applies with memory.activation_offload=true"),))
