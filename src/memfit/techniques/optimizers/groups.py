"""Which trainable parameters go in which parameter group, and which ones GaLore projects.

Weight decay applies to matrices of linear/conv layers only — never to norms, biases or
embeddings (decaying those hurts quality and is what users expect). GaLore projects the
weights of linear and conv layers (attention and MLP matrices, transformers' Conv1D in
GPT-2 included); the embeddings and the output head get the plain inner update, as in the
GaLore paper. Training and the planner both call these functions.
"""

from __future__ import annotations

from torch import nn

from memfit.config.schema import OptimizerConfig

# Output heads are classifiers over the vocabulary, not attention/MLP matrices.
HEAD_NAMES = ("lm_head", "score", "classifier")
_MATRIX_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _is_matrix_layer(module: nn.Module) -> bool:
    # transformers' Conv1D (GPT-2's attention and MLP) is a linear layer with its weight
    # stored in x out; matched by name so this module does not import transformers.
    return isinstance(module, _MATRIX_LAYERS) or type(module).__name__ == "Conv1D"


def galore_targets(model: nn.Module, modules: tuple[str, ...]) -> set[int]:
    """ids of the weights GaLore projects: linear/conv layers except output heads (and,
    when ``modules`` is given, only those whose name contains one of its entries)."""
    found = set()
    for name, module in model.named_modules():
        if not _is_matrix_layer(module) or name.rsplit(".", 1)[-1] in HEAD_NAMES:
            continue
        if modules and not any(part in name for part in modules):
            continue
        if module.weight.requires_grad:
            found.add(id(module.weight))
    return found


def _is_no_decay(name: str, parameter: nn.Parameter, embedding_ids: set[int]) -> bool:
    # 1-D tensors are norms and biases; embeddings are looked up, not multiplied.
    return parameter.ndim < 2 or id(parameter) in embedding_ids or "norm" in name.lower()


def split_parameters(model: nn.Module, targets: set[int] | None
                     ) -> list[tuple[bool, bool, list[nn.Parameter]]]:
    """Trainable parameters (tied ones once) as (decayed?, one of ``targets``?, params),
    in a fixed order: what parameter_groups makes groups of, and what the planner costs."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        key = (not _is_no_decay(name, parameter, embedding_ids),
               targets is not None and id(parameter) in targets)
        groups.setdefault(key, []).append(parameter)
    return [(decayed, projected, parameters)
            for (decayed, projected), parameters in sorted(groups.items())]


def parameter_groups(model: nn.Module, config: OptimizerConfig,
                     targets: set[int] | None) -> list[dict]:
    """Optimizer parameter groups: weight decay for the decayed ones; for an optimizer with
    targets (not None) each group says in ``project`` whether it holds them."""
    result = []
    for decayed, projected, parameters in split_parameters(model, targets):
        group = {"params": parameters, "weight_decay": config.weight_decay if decayed else 0.0}
        if targets is not None:
            group["project"] = projected
        result.append(group)
    return result
