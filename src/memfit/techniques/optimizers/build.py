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

Under FSDP2, an optimizer whose spec ``steps_local_rows`` (and any layer-wise one) is
built over each process's rows of the sharded parameters, in
memfit.distributed.local_rows.LocalRowsOptimizer.
"""

from __future__ import annotations

from torch import nn
from torch.optim import Optimizer

from memfit._utils.errors import ConfigError
from memfit.distributed.fsdp import is_sharded
from memfit.techniques.optimizers.galore import projects_in_backward
from memfit.techniques.optimizers.groups import parameter_groups
from memfit.techniques.optimizers.registry import spec_for
from memfit.techniques.optimizers.setting import OptimizerSetting


def build_optimizer(model: nn.Module, setting: OptimizerSetting) -> Optimizer:
    spec = spec_for(setting.optimizer)
    groups = parameter_groups(model, setting.optimizer, spec.targets(model, setting))
    if not groups:
        raise ConfigError("the model has no trainable parameters (check adapter.*)")
    make = spec.factory(setting)
    if setting.optimizer.layerwise:
        from memfit.optim import LayerwiseOptimizer

        per_parameter = make

        def make(groups: list[dict]) -> Optimizer:
            return LayerwiseOptimizer(
                groups, make_optimizer=per_parameter,
                gradient_accumulation_steps=setting.accumulation_steps,
                max_grad_norm=setting.max_grad_norm,
                projector_refresh=setting.optimizer.galore.layerwise_refresh.value)
    if is_sharded(model) and (spec.steps_local_rows or setting.optimizer.layerwise):
        # Layer-wise too: its hooks hand each process's rows to the per-parameter steps.
        from memfit.distributed.local_rows import LocalRowsOptimizer

        optimizer = LocalRowsOptimizer(groups, make)
    else:
        optimizer = make(groups)
    if projects_in_backward(setting):
        from memfit.optim.backward_projection import project_in_backward

        projected = {id(p) for group in groups if group["project"] for p in group["params"]}
        project_in_backward(model, optimizer, projected)
    return optimizer
