"""LoRA adapters through PEFT: W' = W + (alpha / r) B A with B zero-initialised, on the
modules named by ``adapter.targets``. Only adapter weights train; the base is frozen.
"""

from __future__ import annotations

from torch import nn

from memfit._utils.errors import ConfigError
from memfit.config.schema import AdapterConfig

ALL_LINEAR = "all-linear"


def linear_module_names(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


def apply(model: nn.Module, config: AdapterConfig, is_transformers: bool) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    targets: str | list[str] = list(config.targets)
    if targets == [ALL_LINEAR] and not is_transformers:
        # PEFT resolves "all-linear" only for transformers models; for a plain module we
        # expand it ourselves to every nn.Linear.
        targets = linear_module_names(model)
    elif targets == [ALL_LINEAR]:
        targets = ALL_LINEAR
    lora = LoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                      target_modules=targets)
    try:
        return get_peft_model(model, lora)
    except ValueError as error:
        candidates = ", ".join(sorted({name.rsplit(".", 1)[-1]
                                       for name in linear_module_names(model)}))
        raise ConfigError(
            f"adapter.targets={list(config.targets)} matched no module ({error}); "
            f"linear modules here: {candidates}"
        ) from None
