"""LoRA / DoRA adapters through PEFT: W' = W + (alpha / r) B A with B zero-initialised, on
the modules chosen by ``adapter.targets`` inside ``adapter.restrict_to``. Only adapter
weights (and ``adapter.trainable_modules``) train; the base is frozen.

We resolve targets to exact module names ourselves (PEFT matches name suffixes and knows
"all-linear" only for transformers models), so the same kinds work on any nn.Module — a
Llama, a ViT, or a convolutional autoencoder — and a target that matches nothing is an
error that lists what could have matched.

A classifier's new head (``models.classifier.head_names``) is never adapted: it starts
random, so it trains in full beside the adapters. A sequence classifier's adapter is saved
with PEFT's ``task_type=SEQ_CLS``, as PEFT itself does for that task; an image
classifier's with the head in ``modules_to_save`` (as PEFT's image-classification guide
does); a Hugging Face causal LM's
with ``CAUSAL_LM``, so ``AutoPeftModelForCausalLM`` loads it; any other module's with
none (a plain ``PeftModel``).
The saved ``target_modules`` is the list a PEFT user would write (``peft_target_modules``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

from torch import nn

from memfit._utils.errors import ConfigError
from memfit.config.schema import AdapterConfig
from memfit.models.classifier import HEAD_SUFFIXES
from memfit.techniques.lora_parts import (
    PART_KINDS,
    Rows,
    is_blocked_qkv,
    is_conv1d,
    parts_named,
    rows_of,
)
from memfit.techniques.lora_placements import PLACEMENTS, placed_modules

KINDS = ("attention-qv", "attention-q", "attention-k", "attention-v", "attention", "mlp",
         "all-linear", "conv")
# PEFT has LoRA layers for these convolutions (not for transposed ones).
CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)

# Leaf names used for attention / MLP projections across common architectures
# (Llama, GPT-NeoX, BERT, ViT/timm, T5, DistilBERT, Mixtral experts).
_QUERY = {"q_proj", "query", "q", "q_lin", "wq"}
_KEY = {"k_proj", "key", "k", "k_lin", "wk"}
_VALUE = {"v_proj", "value", "v", "v_lin", "wv"}
_SEPARATE = {"q": _QUERY, "k": _KEY, "v": _VALUE}
# One Linear computing q, k and v together (ViT/timm, GPT-2, GPT-NeoX, MPT, Phi-3); on
# those in lora_parts.BLOCKED_QKV the part kinds place updates on the parts' rows.
FUSED_QKV = {"qkv", "qkv_proj", "c_attn", "query_key_value", "Wqkv", "in_proj"}
_ATTENTION_PARENT = re.compile(r"attn|attention", re.IGNORECASE)
_MLP_PARENT = re.compile(r"mlp|ffn|feed_?forward|intermediate|experts?", re.IGNORECASE)
_MLP_LEAF = {"gate_proj", "up_proj", "down_proj", "fc1", "fc2", "w1", "w2", "w3", "c_fc",
             "fc_in", "fc_out", "wi", "wo", "dense_h_to_4h", "dense_4h_to_h"}


def linear_module_names(model: nn.Module) -> list[str]:
    """nn.Linear and its subclasses (bitsandbytes 4-bit / 8-bit layers included)."""
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


def output_layer_names(model: nn.Module) -> set[str]:
    """The LM head of a transformers model: adapting it is rarely wanted (PEFT's
    all-linear leaves it out too), and it is tied to the embedding in many models."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    return {name for name, module in model.named_modules() if module is head and head is not None}


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _parent(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def _kind_matches(kind: str, name: str, module: nn.Module, heads: set[str]) -> bool:
    if kind == "conv":
        return isinstance(module, CONV_TYPES)
    if isinstance(module, nn.MultiheadAttention):  # q, k, v in one in_proj_weight
        # (PEFT's layer and memfit's need that one weight: kdim = vdim = embed_dim)
        return is_blocked_qkv(name, module) and kind in ("attention", "all-linear", *PART_KINDS)
    if not (isinstance(module, nn.Linear) or is_conv1d(module)) or name in heads:
        return False
    leaf = _leaf(name)
    if kind == "all-linear":
        return True
    if kind in PART_KINDS:
        return (leaf in FUSED_QKV and (kind == "attention-qv" or is_blocked_qkv(name, module))
                or any(leaf in _SEPARATE[part] for part in PART_KINDS[kind]))
    is_attention = (leaf in _QUERY | _KEY | _VALUE | FUSED_QKV | {"o_proj"}
                    or bool(_ATTENTION_PARENT.search(_parent(name))))
    if kind == "attention":
        return is_attention
    return not is_attention and (leaf in _MLP_LEAF or bool(_MLP_PARENT.search(_parent(name))))


def name_matches(pattern: str, name: str) -> bool:
    """A pattern names a module by its full name, its last part, or a glob on either."""
    return fnmatchcase(name, pattern) or fnmatchcase(_leaf(name), pattern)


def inside_parts(name: str, parts: Iterable[str]) -> bool:
    """True when ``name`` is a module matched by one of ``parts`` or lies below one."""
    prefixes = [name[:index] for index, char in enumerate(name) if char == "."] + [name]
    return any(fnmatchcase(prefix, part) for part in parts for prefix in prefixes)


def _adaptable(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, nn.MultiheadAttention, *CONV_TYPES)) or is_conv1d(module)


def _attention_out_projections(modules: dict[str, nn.Module]) -> set[str]:
    """nn.MultiheadAttention's out_proj: its forward reads the weight and never calls the
    Linear, so an adapter there would do nothing; the attention module is adapted instead."""
    return {f"{name}.out_proj" if name else "out_proj" for name, module in modules.items()
            if isinstance(module, nn.MultiheadAttention)}


def resolve_targets(model: nn.Module, config: AdapterConfig) -> list[str]:
    """Full names of the modules that get adapters, or a ConfigError listing candidates."""
    return list(resolve_placement(model, config))


def resolve_placement(model: nn.Module, config: AdapterConfig) -> dict[str, Rows | None]:
    """Each module that gets adapters (full name, in model order): the rows of the q, k, v
    parts placed on it (a fused projection that only part kinds chose), or None for one
    adapter on the whole module. A ConfigError lists the candidates when nothing matches."""
    modules = dict(model.named_modules())
    if config.restrict_to:
        inside = {name for name in modules if name and inside_parts(name, config.restrict_to)}
        if not inside:
            tops = ", ".join(name for name, _ in model.named_children())
            raise ConfigError(f"adapter.restrict_to={list(config.restrict_to)} matches no "
                              f"module; the model's top-level parts are: {tops}")
    else:
        inside = set(modules)
    heads = output_layer_names(model)
    ignored = _attention_out_projections(modules)
    placed = placed_modules(model, config.targets,
                            [name for name, module in modules.items()
                             if _adaptable(module) and name not in ignored])
    chosen: dict[str, Rows | None] = {}
    for name, module in modules.items():
        if name not in inside or not name or not _adaptable(module) or name in ignored:
            continue
        matching = [target for target in config.targets
                    if (name in placed[target] if target in placed
                        else _kind_matches(target, name, module, heads) if target in KINDS
                        else type(module).__name__ == target or name_matches(target, name))]
        if not matching:
            continue
        by_parts = is_blocked_qkv(name, module) and all(t in PART_KINDS for t in matching)
        if is_conv1d(module) and not by_parts:
            # GPT-2's Conv1D takes memfit's part layer only: PEFT's own flips fan_in_fan_out
            # in the saved adapter_config.json, a setting memfit merge does not accept.
            continue
        chosen[name] = (rows_of(name, module, getattr(model, "config", None),
                                parts_named(tuple(matching))) if by_parts else None)
    if not chosen:
        raise ConfigError(_no_match_message(modules, inside, config))
    return chosen


def _no_match_message(modules: dict[str, nn.Module], inside: set[str],
                      config: AdapterConfig) -> str:
    ignored = _attention_out_projections(modules)
    candidates = [(name, module) for name, module in modules.items()
                  if name in inside and name and _adaptable(module) and name not in ignored]
    leaves = sorted({_leaf(name) for name, _ in candidates})
    classes = sorted({type(module).__name__ for _, module in candidates})
    where = f" inside adapter.restrict_to={list(config.restrict_to)}" if config.restrict_to else ""
    return (f"adapter.targets={list(config.targets)} matched no module{where}; valid kinds: "
            f"{', '.join(KINDS + PLACEMENTS)}; module names here: {', '.join(leaves) or 'none'}; "
            f"classes: {', '.join(classes) or 'none'}")


def resolve_trainable_modules(model: nn.Module, patterns: tuple[str, ...]) -> list[str]:
    modules = [name for name, _ in model.named_modules() if name]
    chosen = [name for name in modules if any(name_matches(p, name) for p in patterns)]
    # Keep only the outermost match: PEFT copies a whole module, children included.
    chosen = [name for name in chosen if not any(name.startswith(o + ".") for o in chosen)]
    if patterns and not chosen:
        tops = ", ".join(name for name, _ in model.named_children())
        raise ConfigError(f"adapter.trainable_modules={list(patterns)} matches no module; "
                          f"top-level parts: {tops}")
    return chosen


def apply(model: nn.Module, config: AdapterConfig,
          classifier_head: Sequence[str] = (), sequence_classifier: bool = True,
          autocast: bool = False) -> nn.Module:
    """Wrap ``model`` in a PEFT model with LoRA (or DoRA) on the resolved targets.
    ``classifier_head``: a classifier's new head (top-level module names); a sequence
    classifier's is saved with PEFT's ``task_type=SEQ_CLS``, any other's (an image
    classifier: PEFT's SEQ_CLS model takes token inputs) as ``modules_to_save``.
    ``autocast``: training runs under bf16/fp16 autocast (``uncast_inputs``)."""
    from peft import LoraConfig, get_peft_model

    from memfit.techniques import lora_layers

    placement = {name: rows for name, rows in resolve_placement(model, config).items()
                 if not inside_parts(name, classifier_head)}
    targets = list(placement)
    if not targets:
        raise ConfigError(f"adapter.targets={list(config.targets)} matched only the new "
                          f"classification head ({', '.join(classifier_head)}), which trains "
                          "in full; target the layers below it (e.g. all-linear)")
    # PEFT copies a whole module: the head's, and no part of it again. With task_type
    # SEQ_CLS it adds "classifier" and "score" to modules_to_save itself.
    trainable = [name for name in resolve_trainable_modules(model, config.trainable_modules)
                 if not inside_parts(name, classifier_head)]
    trainable += [name for name in classifier_head
                  if name not in HEAD_SUFFIXES or not sequence_classifier]
    modules = dict(model.named_modules())
    overlap = sorted(set(targets) & set(trainable))
    if overlap:
        raise ConfigError(f"adapter.trainable_modules and adapter.targets both name {overlap[0]}"
                          "; a module is either adapted or trained in full")
    lora = LoraConfig(
        r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
        use_rslora=config.rslora, use_dora=config.dora,
        target_modules=peft_target_modules(targets, [name for name in modules if name]),
        modules_to_save=trainable or None,
        task_type="SEQ_CLS" if classifier_head and sequence_classifier else None,
    )
    lora_layers.register(lora, {id(modules[name]): rows for name, rows in placement.items()
                                if rows is not None})
    # PEFT keeps adapter weights in fp32 even on a bf16/4-bit base (autocast_adapter_dtype).
    try:
        adapted = get_peft_model(model, lora)
    except ValueError as error:  # PEFT's word on a setting for a layer (e.g. DoRA on MHA)
        reason = " ".join(str(error).split())
        raise ConfigError(f"adapter: PEFT cannot apply LoRA as configured: {reason}") from None
    if not classifier_head and _generates(model):
        # For the saved adapter_config.json only (PEFT reads task_type when saving and
        # loading): loaded, it is a PeftModelForCausalLM, as AutoPeftModelForCausalLM
        # expects; training keeps the plain wrapper's forward, as it always has.
        adapted.peft_config[adapted.active_adapter].task_type = "CAUSAL_LM"
    if autocast:
        uncast_inputs(adapted)
    return adapted


def uncast_inputs(model: nn.Module) -> None:
    """Under autocast, adapters take their input as it comes. PEFT casts it to the
    adapters' fp32 first, and autocast casts that back for the matmul, so each adapted
    projection made an fp32 ``[tokens, in]`` temporary and saved a copy of its input for
    backward (Llama's q, k and v: three copies of one input; uncast they share it).
    Exact: bf16 -> fp32 -> bf16 is the identity, and autocast computes the matmul in its
    dtype either way. DoRA layers keep the cast (their variant's forward is PEFT's)."""
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if isinstance(module, LoraLayer) and not module.lora_variant:
            module.cast_input_dtype_enabled = False  # PEFT's switch (_cast_input_dtype)


def peft_target_modules(targets: Sequence[str], names: Sequence[str]) -> list[str] | str:
    """``targets`` (full module names) as PEFT's ``target_modules``, in the shortest form that
    PEFT's own matching reads back as exactly ``targets`` among the model's module
    ``names``: their last parts (``["q_proj", "v_proj"]``, as a PEFT user writes them), else
    the full names (a list entry matches a name equal to it or ending in ``.entry``), else
    an anchored alternation of the exact names, which PEFT full-matches (a full name that
    ends another's: ``fc`` beside ``encoder.fc``)."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    wanted = set(targets)
    for entries in (sorted({_leaf(name) for name in targets}), sorted(wanted)):
        config = LoraConfig(target_modules=entries)
        if {name for name in names if check_target_module_exists(config, name)} == wanted:
            return entries
    return "^(?:" + "|".join(re.escape(name) for name in targets) + ")$"


def _generates(model: nn.Module) -> bool:
    """A Hugging Face model that generates text: what PEFT's ``PeftModelForCausalLM``
    (task type CAUSAL_LM) wraps; it needs ``prepare_inputs_for_generation``."""
    from transformers import GenerationMixin, PreTrainedModel

    return isinstance(model, PreTrainedModel) and isinstance(model, GenerationMixin)


def placed_parts(model: nn.Module) -> dict[str, Rows]:
    """The q, k, v parts memfit's layers carry in the adapted ``model``: module name (as in
    the base model) -> rows; what ``adapter/parts.json`` records."""
    from memfit.techniques.lora_layers import FusedParts

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {name: dict(module.rows) for name, module in base.named_modules()
            if isinstance(module, FusedParts)}


def check_applied(model: nn.Module) -> None:
    """Only adapter weights and ``adapter.trainable_modules`` may train, and some must."""
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    adapters = [name for name in trainable if "lora_" in name]
    others = [name for name in trainable if "lora_" not in name and "modules_to_save" not in name]
    if not adapters:
        raise ConfigError("adapter.kind: no adapter parameter requires grad after applying "
                          "LoRA; check adapter.targets")
    if others:
        raise ConfigError(f"adapter.kind: {len(others)} base parameters still require grad "
                          f"(e.g. {others[0]}); list fully trained modules in "
                          "adapter.trainable_modules")
    unused = _unused_out_projection_adapters(model)
    if unused:
        raise ConfigError(f"adapter.targets: {unused[0]} is the out_proj of an "
                          "nn.MultiheadAttention, whose forward never calls it, so its adapter "
                          "would not train; target the attention module instead")


def _unused_out_projection_adapters(model: nn.Module) -> list[str]:
    """Adapter layers on a plain nn.MultiheadAttention's out_proj (PEFT's own attention
    layer adapts its out_proj through the weights, and is no plain one)."""
    from peft.tuners.lora import LoraLayer

    wrapped = {id(module.get_base_layer()) for module in model.modules()
               if isinstance(module, LoraLayer)}
    return [f"{name}.out_proj" for name, module in model.named_modules()
            if isinstance(module, nn.MultiheadAttention) and id(module) not in wrapped
            and isinstance(module.out_proj, LoraLayer)]


def check_gradients_reached(model: nn.Module) -> None:
    """Call after the first backward: every adapter gradient missing means something in
    the forward (reentrant checkpointing, a detach, no_grad) cut the adapters off."""
    adapters = [p for name, p in model.named_parameters() if p.requires_grad and "lora_" in name]
    if adapters and all(p.grad is None for p in adapters):
        raise ConfigError("no gradient reached the LoRA adapters in backward: the forward "
                          "detaches them (e.g. reentrant activation checkpointing); try "
                          "memory.gradient_checkpointing=false")
