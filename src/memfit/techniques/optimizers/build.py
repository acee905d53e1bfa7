"""``optimizer.*`` -> a torch Optimizer over the trainable parameters, from the optimizer's
spec (registry.spec_for) and the parameter groups of groups.py.

``precision=bf16-pure`` keeps bf16 weights with no fp32 master copy, so the update must
be written back with stochastic rounding (memfit.optim.AdamW / GaLore do) or small updates
vanish; config validation rejects optimizers whose spec does not round stochastically.

GaLore (svd, randomized_svd) takes the projected gradient R = P^T G of linear layers straight
from their backward on steps that keep P (``optimizer.galore.project_in_backward``).

``optimizer.layerwise`` wraps one inner optimizer per parameter in
memfit.optim.LayerwiseOptimizer: steps run inside backward and gradients are clipped per
tensor (a global norm is not known until backward ends; see memfit/optim/layerwise.py).
"""

from __future__ import annotations

from torch import nn
from torch.optim import Optimizer

from memfit._utils.errors import ConfigError
from memfit.config.schema import Config, GaloreProjector, OptimizerName, Precision
from memfit.techniques.optimizers.groups import parameter_groups
from memfit.techniques.optimizers.registry import spec_for


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
    spec = spec_for(config)
    groups = parameter_groups(model, config.optimizer, spec.targets(model, config))
    if not groups:
        raise ConfigError("the model has no trainable parameters (check adapter.*)")
    make = spec.factory(config)
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
