"""An optimizer's options: the optimizer.* keys its spec reads, each left null in the config
taking the spec's own default (Lion's betas are (0.9, 0.99), AdamW's (0.9, 0.999))."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from memfit.config.schema import OptimizerConfig
from memfit.techniques import own_keys

Block = TypeVar("Block")

# What every optimizer reads; the rest of optimizer.* belongs to the specs that list it.
SHARED_KEYS = ("name", "lr", "weight_decay", "layerwise")


def resolved_option(optimizer: OptimizerConfig, key: str, defaults: Mapping[str, Any]) -> Any:
    """optimizer.<key> as an optimizer whose spec's options are ``defaults`` runs it: the
    config's value, or the default where the config leaves it null."""
    value = getattr(optimizer, key)
    return defaults[key] if value is None else value


def own_options(block: type[Block], optimizer: OptimizerConfig) -> Block:
    """The spec's own block (``OptimizerSpec.own``) as optimizer.* sets it."""
    return own_keys.read_own(block, "optimizer", optimizer.own,
                             f"optimizer.name={optimizer.name}")


def adam_options(optimizer: OptimizerConfig, defaults: Mapping[str, Any]) -> dict:
    """lr, betas, eps: what memfit's Adam-type optimizers take from optimizer.*."""
    return {"lr": optimizer.lr, "betas": tuple(resolved_option(optimizer, "betas", defaults)),
            "eps": resolved_option(optimizer, "eps", defaults)}
