"""memfit: fine-tune PyTorch models inside the GPU memory you actually have.

Python entry points (imported lazily, so ``import memfit`` stays cheap):
``memfit.train(config)`` — see ``memfit.training.api.train``;
``memfit.plan(config, "24GiB")`` — see ``memfit.plan.planner.plan``.
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
    raise AttributeError(f"module 'memfit' has no attribute {name!r}")
