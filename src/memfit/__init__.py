"""memfit: fine-tune PyTorch models inside the GPU memory you actually have.

Python entry points (imported lazily, so ``import memfit`` stays cheap):
``memfit.train(config)`` — see ``memfit.training.api.train``.
"""

from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "train":
        from memfit.training.api import train

        return train
    raise AttributeError(f"module 'memfit' has no attribute {name!r}")
