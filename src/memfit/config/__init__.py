"""Typed configuration: schema, loading (YAML + overrides) and validation."""

from memfit.config.load import from_mapping, load_config, to_mapping, to_yaml
from memfit.config.schema import Config

__all__ = ["Config", "from_mapping", "load_config", "to_mapping", "to_yaml"]
