"""memfit: fine-tune PyTorch models inside the GPU memory you actually have.

Python entry points (imported lazily, so ``import memfit`` stays cheap):
``memfit.train(config)`` — see ``memfit.training.api.train``;
``memfit.plan(config, "24GiB")`` — see ``memfit.plan.planner.plan``;
``memfit.load_config("run.yaml", ["optimizer.lr=1e-4"])`` — a checked Config from YAML and
overrides, as ``memfit train`` reads them (``memfit.techniques.config_checks.load_config``).
"""

from __future__ import annotations

import logging

from memfit._utils.version import VERSION

__version__ = VERSION

# Before anything imports bitsandbytes (memfit's optimizers and quantization, or PEFT and
# transformers on memfit's behalf): on import it tries an optional CPU kernel from the
# hub and logs a warning when it cannot (always, offline: "Failed to load CPU
# gemm_4bit_forward from kernels-community ..."), then uses its own kernel. That logger
# says nothing else; its errors still show.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def __getattr__(name: str):
    if name == "train":
        from memfit.training.api import train

        return train
    if name == "plan":
        import memfit.plan as plan  # the subpackage is itself callable (plan/__init__.py)

        return plan
    if name == "load_config":
        from memfit.techniques.config_checks import load_config

        return load_config
    raise AttributeError(f"module 'memfit' has no attribute {name!r}")
