"""optimizer.name="package.module:Class" (or "path/to/file.py:Class"): any
torch.optim.Optimizer the user brings, built as ``Class(groups, lr=optimizer.lr,
**optimizer.kwargs)`` over memfit's parameter groups (weight decay per group).

memfit knows nothing of its state, so the planner learns it: one parameter of each distinct
shape and dtype is built on fake tensors (torch's FakeTensorMode: shapes, no memory), given
a gradient, stepped once, and the tensors left in its state are counted. An optimizer whose
step needs real values (e.g. reads a number with .item()) cannot be planned: the planner
says so. Its step scratch is taken as one parameter-sized temporary (unmeasured).
"""

from __future__ import annotations

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.optim import Optimizer

from memfit._utils.errors import ConfigError, first_line
from memfit.config.schema import OptimizerConfig
from memfit.models.load import import_object
from memfit.techniques.optimizers.setting import OptimizerSetting
from memfit.techniques.optimizers.spec import Factory, OptimizerSpec, Param, ParamCost

_DTYPES = {8: torch.float64, 4: torch.float32, 2: torch.bfloat16}


def optimizer_class(optimizer: OptimizerConfig) -> type[Optimizer]:
    """The class optimizer.name names, or a ConfigError saying why it cannot be one."""
    reference = optimizer.name
    found = import_object(reference, "optimizer.name")
    if not (isinstance(found, type) and issubclass(found, Optimizer)):
        raise ConfigError(f"optimizer.name={reference!r} is not a torch.optim.Optimizer "
                          f"subclass (it is {type(found).__name__})")
    return found


def _factory(setting: OptimizerSetting) -> Factory:
    chosen = setting.optimizer
    cls = optimizer_class(chosen)
    options = {"lr": chosen.lr, **chosen.kwargs}

    def make(groups: list[dict]) -> Optimizer:
        try:
            optimizer = cls(groups, **options)
        except Exception as error:  # noqa: BLE001 - the user's optimizer failed; say which
            raise ConfigError(f"optimizer.name={chosen.name!r} refused "
                              f"optimizer.kwargs={dict(chosen.kwargs)}: "
                              f"{first_line(error)}") from None
        _check_state_after_first_step(optimizer, chosen.name)
        return optimizer

    return make


# What torch.load(weights_only=True) restores, and so what a checkpoint can hold.
_RESTORABLE = (torch.Tensor, int, float, complex, bool, str, bytes, type(None))


def _check_state_after_first_step(optimizer: Optimizer, name: str) -> None:
    """After its first step, refuse an optimizer whose state holds something a checkpoint
    cannot restore (found at the first checkpoint, it would stop the run with a pickling
    traceback after all the steps before it)."""
    def check(optimizer: Optimizer, args: object, kwargs: object) -> None:
        handle.remove()
        for state in optimizer.state.values():
            for key, value in state.items():
                odd = _unrestorable(value)
                if odd is not None:
                    raise ConfigError(
                        f"optimizer.name={name!r} keeps a {type(odd).__name__} in its state "
                        f"({key!r}), which a checkpoint cannot restore with "
                        "torch.load(weights_only=True); keep tensors and numbers in "
                        "optimizer.state")

    handle = optimizer.register_step_post_hook(check)


def _unrestorable(value: object) -> object | None:
    """The first value inside ``value`` (lists, tuples, dicts walked) that is not one of
    the restorable types, or None."""
    if isinstance(value, (list, tuple)):
        return next((odd for item in value if (odd := _unrestorable(item)) is not None), None)
    if isinstance(value, dict):
        return next((odd for item in (*value.keys(), *value.values())
                     if (odd := _unrestorable(item)) is not None), None)
    return None if isinstance(value, _RESTORABLE) else value


def _costs(params: list[Param], setting: OptimizerSetting) -> list[ParamCost]:
    make = _factory(setting)
    distinct = list(dict.fromkeys((p.shape, p.element_size) for p in params))
    state: dict[tuple, int] = {}
    try:
        with FakeTensorMode():
            for shape, element_size in distinct:
                weight = nn.Parameter(torch.empty(shape, dtype=_DTYPES[element_size]))
                weight.grad = torch.empty_like(weight)
                optimizer = make([{"params": [weight]}])
                optimizer.step()
                tensors = [value for value in optimizer.state[weight].values()
                           if isinstance(value, torch.Tensor)]
                state[shape, element_size] = sum(t.numel() * t.element_size() for t in tensors)
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's optimizer failed; say which
        raise ConfigError(f"cannot plan optimizer.name={setting.optimizer.name!r}: one step on "
                          f"fake tensors failed ({first_line(error)}); train it without "
                          "memfit plan / memory.auto") from None
    return [ParamCost(state[p.shape, p.element_size], p.nbytes, p.nbytes) for p in params]


def spec(optimizer: OptimizerConfig) -> OptimizerSpec:
    return OptimizerSpec(name=optimizer.name, docs_row=DOCS_ROW, options={"kwargs": None},
                         factory=_factory, costs=_costs, bench=())


DOCS_ROW = ("any `torch.optim.Optimizer` you bring: `Class(groups, lr=optimizer.lr, "
            "**optimizer.kwargs)` over memfit's parameter groups",
            "what one step on fake tensors leaves (`memfit plan` learns it; an optimizer that "
            "reads values with `.item()` cannot be planned and `memfit plan` says so)")
