"""``optimizer.*`` -> a torch Optimizer over the trainable parameters.

Parameter groups: weight decay applies to matrices of linear/conv layers only — never to
norms, biases or embeddings (decaying those hurts quality and is what users expect).
"""

from __future__ import annotations

from torch import nn
from torch.optim import Optimizer

from memfit._utils.errors import ConfigError
from memfit.config.schema import OptimizerConfig, OptimizerName


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into decayed and non-decayed groups."""
    embedding_params = {
        id(module.weight) for module in model.modules() if isinstance(module, nn.Embedding)
    }
    decayed, not_decayed = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        # 1-D tensors are norms and biases; embeddings are looked up, not multiplied.
        if parameter.ndim < 2 or id(parameter) in embedding_params or "norm" in name.lower():
            not_decayed.append(parameter)
        else:
            decayed.append(parameter)
    groups = [{"params": decayed, "weight_decay": weight_decay},
              {"params": not_decayed, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def build_optimizer(model: nn.Module, config: OptimizerConfig) -> Optimizer:
    import torch

    groups = parameter_groups(model, config.weight_decay)
    if not groups:
        raise ConfigError("the model has no trainable parameters (check adapter.*)")
    name = config.name
    if name is OptimizerName.ADAMW:
        return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps,
                                 foreach=True)
    if name is OptimizerName.ADAMW8BIT:
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(groups, lr=config.lr, betas=config.betas, eps=config.eps)
    if name is OptimizerName.ADAFACTOR:
        # torch's Adafactor: no first moment, relative step size always on (lr is the
        # maximum); see docs/optimizers.md for how it differs from transformers' version.
        return torch.optim.Adafactor(groups, lr=config.lr, eps=(None, 1e-3))
    if name is OptimizerName.SGD:
        return torch.optim.SGD(groups, lr=config.lr)
    raise ConfigError(f"optimizer.name={name} has no builder yet")
