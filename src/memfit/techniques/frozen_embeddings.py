"""memory.freeze_embeddings: a full fine-tune that leaves the input embedding and the output
layer as they are. On a large-vocabulary model they are much of the weights (Llama 3 8B,
untied: 2 x 128256 x 4096 = 1.05B of 8.0B), and a fine-tune that keeps its vocabulary
seldom needs to move them; frozen, they take no gradient and no optimizer state.

Which modules: ``get_input_embeddings()`` / ``get_output_embeddings()`` where the model has
them (transformers models; tied weights are one parameter), else every ``nn.Embedding``.
"""

from __future__ import annotations

from torch import nn

from memfit._utils.errors import ConfigError


def embedding_modules(model: nn.Module) -> list[nn.Module]:
    """The input embedding and the output layer of ``model`` (each once), or its
    nn.Embedding modules where it names neither."""
    found = []
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        method = getattr(model, getter, None)
        module = method() if callable(method) else None
        if isinstance(module, nn.Module) and all(module is not seen for seen in found):
            found.append(module)
    return found or [module for module in model.modules() if isinstance(module, nn.Embedding)]


def freeze(model: nn.Module) -> nn.Module:
    for module in embedding_modules(model):
        module.requires_grad_(False)
    return model


def check_applied(model: nn.Module) -> None:
    modules = embedding_modules(model)
    if not modules:
        raise ConfigError("memory.freeze_embeddings=true found no embedding to freeze: the "
                          "model has no get_input_embeddings()/get_output_embeddings() and no "
                          "nn.Embedding; set memory.freeze_embeddings=false")
    if any(parameter.requires_grad for module in modules for parameter in module.parameters()):
        raise ConfigError("memory.freeze_embeddings=true, but an embedding still trains "
                          "(something made it trainable again after memfit froze it)")
