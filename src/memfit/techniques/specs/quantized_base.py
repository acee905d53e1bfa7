"""The quantized base of QLoRA (adapter.kind=qlora): techniques/quantize.py in training,
techniques/quantize_stand_in.py in the planner.

Training quantizes while loading (Hugging Face folders are quantized by transformers as
they load, so full-precision weights never exist all at once; ``load_quantization``), or
built models in the load stage; the planner puts its stand-in in after the adapters (PEFT
wraps plain nn.Linear layers; the stand-in then replaces the frozen layer inside): the same
modules with the same bytes.
"""

from __future__ import annotations

from torch import nn

from memfit.config.choices import CLASSIFYING_TASKS
from memfit.config.schema import AdapterKind
from memfit.models.classifier import HEAD_SUFFIXES, head_names
from memfit.techniques import lora, quantize, quantize_stand_in
from memfit.techniques.moments import Moment, StepBytes, moment
from memfit.techniques.specs.spec import Setting, TechniqueOptions, TechniqueSpec


def enabled(options: TechniqueOptions) -> bool:
    return options.adapter.kind is AdapterKind.QLORA


def load_quantization(options: TechniqueOptions):
    """transformers' BitsAndBytesConfig for a Hugging Face folder loaded with a quantized
    base, else None. The new head of a sequence classifier and adapter.trainable_modules
    stay unquantized (they train in full)."""
    if not (enabled(options) and quantize.quantized_while_loading(options.model)):
        return None
    unquantized = list(options.adapter.trainable_modules)
    if options.model.task in CLASSIFYING_TASKS:
        unquantized += HEAD_SUFFIXES
    return quantize.bnb_config(options.adapter, options.precision, unquantized)


def apply(model: nn.Module, setting: Setting) -> nn.Module:
    """Built models are quantized here, all but the output layer and
    adapter.trainable_modules; folders were while loading (``load_quantization``)."""
    options = setting.options
    if not quantize.quantized_while_loading(options.model):
        keep = lora.output_layer_names(model) | set(
            lora.resolve_trainable_modules(model, options.adapter.trainable_modules))
        if options.model.task in CLASSIFYING_TASKS:  # the new head trains in full
            keep |= set(head_names(model))
        quantize.quantize_linears(model, options.adapter, options.precision, keep)
    quantize.keep_training_layout(model)
    return model


def check_applied(model: nn.Module, options: TechniqueOptions) -> list[str]:
    return quantize.check_applied(model)


def plan_apply(model: nn.Module, setting: Setting) -> nn.Module:
    options = setting.options
    quantize_stand_in.stand_in_for_frozen_linears(
        model, options, setting.output_layer,
        quantize_stand_in.quantized_path(options.adapter, setting.device))
    return model


def moments(step: StepBytes, options: TechniqueOptions) -> list[Moment]:
    """Quantizing the base: before any step, the largest layer in full precision (or, for a
    built model on a CPU device, every layer; on a GPU it is quantized in host memory
    before it is placed) beside the quantized ones. Planned beside the weights and
    optimizer state as training holds them (the state and adapters do not exist yet: an
    upper bound), so a plan covers loading too when the steps hold little more than the
    weights (a large base, short sequences)."""
    return [moment("quantizing the base",
                   "loading: the layer being quantized in the dtype it is quantized from, "
                   "bitsandbytes' scratch, the kept output layer before its cast",
                   grads=0, activations=0, temporaries=step.quantizing)]


SPEC = TechniqueSpec(
    name="quantized base",
    docs_row="QLoRA: NF4 (double quant) or int8 frozen base",
    keys=("adapter.kind=qlora", "adapter.quantization", "adapter.double_quant"),
    stage="load", enabled=enabled,
    plan="techniques.quantize_stand_in: QuantizedLinear's bytes and matmul memory",
    apply=apply, check_applied=check_applied, plan_apply=plan_apply, moments=moments,
    # The qlora row is NF4 with double quantization, whatever base the config quantizes.
    row_reset=("adapter.quantization", "adapter.double_quant"))
