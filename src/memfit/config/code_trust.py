"""Config keys that name Python code, and the opt-in memfit needs before importing code
named by a configuration it did not get from the user directly.

A run folder (``--resume``, ``memfit merge``) is data people download and pass around. Its
``config.yaml`` may name ``model.factory``, ``model.loss`` or a class-path
``optimizer.name``; importing one runs whatever that module does at import time. Like
``trust_remote_code`` in transformers, memfit imports such code only when the user says so
(``--trust-code``). A config file the user names for a fresh ``memfit train`` is the user's
own choice and needs no opt-in.
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

from memfit._utils.errors import ConfigError
from memfit.config.schema import Config

TRUST_FLAG = "--trust-code"


def code_references(config: Config) -> list[tuple[str, str]]:
    """``[(key, "module:name"), ...]`` for every key of ``config`` that names code to import."""
    found = [("model.factory", config.model.factory), ("model.loss", config.model.loss)]
    if ":" in config.optimizer.name:  # a class path; memfit's own names have no colon
        found.append(("optimizer.name", config.optimizer.name))
    return [(key, reference) for key, reference in found if reference]


def module_file(module: str) -> str:
    """Where ``module`` ("pkg.mod" or "path/to/file.py") would be imported from, found
    without importing anything (``importlib.util.find_spec`` would run a package's
    ``__init__``); ``"not found"`` if nowhere."""
    if module.endswith(".py"):
        return module
    spec, search, parts = None, None, module.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        spec = importlib.machinery.PathFinder.find_spec(name, search)
        if spec is None:
            return "not found"
        search = spec.submodule_search_locations
    origin = spec.origin if spec is not None else None
    return str(Path(origin)) if origin and origin not in ("built-in", "frozen") else "built in"


def refuse_untrusted_code(config: Config, source: str, trusted: bool) -> None:
    """Refuse, in one line, a ``config`` read from ``source`` (e.g. a run folder's
    config.yaml) that names code to import, unless the user passed ``--trust-code``."""
    references = code_references(config)
    if trusted or not references:
        return
    key, reference = references[0]
    module = reference.rpartition(":")[0]
    more = f" (and {len(references) - 1} more)" if len(references) > 1 else ""
    raise ConfigError(
        f"{source} names code to import: {key}={reference!r}{more}, module {module!r} from "
        f"{module_file(module)}; memfit runs code named by a run folder only with "
        f"{TRUST_FLAG}: read that file, then pass {TRUST_FLAG} if you trust it")
