"""``optimizer.*`` -> a torch Optimizer over the trainable parameters.

Parameter groups: weight decay applies to matrices of linear/conv layers only — never to
norms, biases or embeddings (decaying those hurts quality and is what users expect).
GaLore projects the weights of linear and conv layers (attention and MLP matrices); the
embeddings and the output head get the plain inner update, as in the GaLore paper.

``precision=bf16-pure`` keeps bf16 weights with no fp32 master copy, so the update must
be written back with stochastic rounding (memfit.optim.AdamW / GaLore do) or small updates
vanish; config validation rejects optimizers that round to nearest for it.

GaLore (svd, randomized_svd) takes the projected gradient R = P^T G of linear layers straight
from their backward on steps that keep P (``optimizer.galore.project_in_backward``).

``optimizer.layerwise`` wraps one inner optimizer per parameter in
memfit.optim.LayerwiseOptimizer: steps run inside backward and gradients are clipped per
tensor (a global norm is not known until backward ends; see memfit/optim/layerwise.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.optim import Optimizer

from memfit._utils.errors import ConfigError
from memfit.config.schema import (
    Config,
    GaloreProjector,
    OptimizerConfig,
    OptimizerName,
    Precision,
)

# Output heads are classifiers over the vocabulary, not attention/MLP matrices.
HEAD_NAMES = ("lm_head", "score", "classifier")


def _is_no_decay(name: str, parameter: nn.Parameter, embedding_ids: set[int]) -> bool:
    # 1-D tensors are norms and biases; embeddings are looked up, not multiplied.
    return parameter.ndim < 2 or id(parameter) in embedding_ids or "norm" in name.lower()


def _projectable_ids(model: nn.Module, modules: tuple[str, ...]) -> set[int]:
    """Weights GaLore projects: linear/conv layers except output heads (and, when
    ``modules`` is given, only those whose name contains one of its entries)."""
    found = set()
    for name, module in model.named_modules():
        if not isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            continue
        if name.rsplit(".", 1)[-1] in HEAD_NAMES:
            continue
        if modules and not any(part in name for part in modules):
            continue
        if module.weight.requires_grad:
            found.add(id(module.weight))
    return found


def parameter_groups(model: nn.Module, config: OptimizerConfig) -> list[dict]:
    """Trainable parameters split by (weight decay?, projected by GaLore?)."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    galore = config.name is OptimizerName.GALORE
    projectable = _projectable_ids(model, config.galore.modules) if galore else set()
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        key = (not _is_no_decay(name, parameter, embedding_ids), id(parameter) in projectable)
        groups.setdefault(key, []).append(parameter)
    result = []
    for (decayed, projected), parameters in sorted(groups.items()):
        group = {"params": parameters, "weight_decay": config.weight_decay if decayed else 0.0}
        if galore:
            group["project"] = projected
        result.append(group)
    return result


def _factory(config: OptimizerConfig, precision: Precision) -> Callable[[list[dict]], Optimizer]:
    """A function building the optimizer over given parameter groups."""
    name, common = config.name, {"lr": config.lr}
    adam = {**common, "betas": config.betas, "eps": config.eps}
    if name is OptimizerName.ADAMW:
        if precision is Precision.BF16_PURE:
            from memfit.optim import AdamW

            return lambda groups: AdamW(groups, **adam)
        return lambda groups: torch.optim.AdamW(groups, **adam, foreach=True)
    if name in (OptimizerName.ADAMW8BIT, OptimizerName.PAGED_ADAMW8BIT):
        if name is OptimizerName.PAGED_ADAMW8BIT and not torch.cuda.is_available():
            raise ConfigError("optimizer.name=paged_adamw8bit needs CUDA (it pages GPU "
                              "memory to the host); use adamw8bit on this machine")
        import bitsandbytes as bnb

        cls = bnb.optim.PagedAdamW8bit if name is OptimizerName.PAGED_ADAMW8BIT else \
            bnb.optim.AdamW8bit
        return lambda groups: cls(groups, **adam)
    if name is OptimizerName.ADAFACTOR:
        # torch's Adafactor: no first moment, relative step size always on (lr is the
        # maximum step), eps=(None, 1e-3) = eps1 from the dtype; see docs/optimizers.md.
        return lambda groups: torch.optim.Adafactor(groups, **common)
    if name is OptimizerName.SGD:
        return lambda groups: torch.optim.SGD(groups, **common)
    if name is OptimizerName.GALORE:
        from memfit.optim import GaLore

        galore = config.galore
        return lambda groups: GaLore(
            groups, **adam, rank=galore.rank, update_gap=galore.update_gap, scale=galore.scale,
            projector=galore.projector.value, inner=galore.inner.value,
            subspace_change=galore.subspace_change.value)
    raise ConfigError(f"optimizer.name={name} has no builder")


def projects_in_backward(config: Config) -> bool:
    """Whether GaLore takes R = P^T G from linear layers' backward (see
    memfit/optim/backward_projection.py): not where a step needs every full gradient
    (online/random projectors), where P lives on the host between steps (optimizer
    offload) or where GradScaler must unscale the gradients (fp16)."""
    optimizer = config.optimizer
    return (optimizer.name is OptimizerName.GALORE and optimizer.galore.project_in_backward
            and optimizer.galore.projector in (GaloreProjector.SVD,
                                               GaloreProjector.RANDOMIZED_SVD)
            and not config.memory.optimizer_offload and config.precision is not Precision.FP16)


def build_optimizer(model: nn.Module, config: Config) -> Optimizer:
    groups = parameter_groups(model, config.optimizer)
    if not groups:
        raise ConfigError("the model has no trainable parameters (check adapter.*)")
    make = _factory(config.optimizer, config.precision)
    if config.optimizer.layerwise:
        from memfit.optim import LayerwiseOptimizer

        optimizer = LayerwiseOptimizer(
            groups, make_optimizer=make,
            gradient_accumulation_steps=config.train.gradient_accumulation_steps,
            max_grad_norm=config.train.max_grad_norm,
            projector_refresh=config.optimizer.galore.layerwise_refresh.value)
    else:
        optimizer = make(groups)
    if projects_in_backward(config):
        from memfit.optim.backward_projection import project_in_backward

        projected = {id(p) for group in groups if group["project"] for p in group["params"]}
        project_in_backward(model, optimizer, projected)
    return optimizer
