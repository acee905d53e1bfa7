"""Typed configuration: schema, loading (YAML + overrides) and the rules that need no spec.
memfit.techniques.config_checks builds a validated Config (``from_mapping``,
``load_config``)."""

from memfit.config.load import to_mapping, to_yaml
from memfit.config.schema import Config

__all__ = ["Config", "to_mapping", "to_yaml"]
