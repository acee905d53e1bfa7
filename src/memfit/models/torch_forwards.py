"""Models load with transformers' own forwards, not the kernels hub's.

transformers 5 kernelizes a model it loads whenever the ``kernels`` package is installed
(a dependency of transformers): a module whose class is decorated with
``use_kernel_forward_from_hub`` (Llama's RMSNorm, ...) gets a Hub kernel's forward where
one exists for the device, and each ``train()`` / ``eval()`` redoes that, dropping any
forward set on the instance: memfit's tiled norms ran untiled after ``model.train()``.
memfit's techniques set such forwards and its planner traces the torch code, so every
load of a pretrained model passes ``torch_forwards()``: what trains is what was planned,
offline too.
"""

from __future__ import annotations


def torch_forwards() -> dict[str, bool]:
    """``from_pretrained`` keywords that keep transformers' own forwards: ``use_kernels``
    where ``PreTrainedModel`` has it (transformers 5 does, and kernelizes by default);
    elsewhere none, as a keyword ``from_pretrained`` does not know reaches the model's
    constructor."""
    from transformers import PreTrainedModel  # imported already by whoever loads a model

    return {"use_kernels": False} if hasattr(PreTrainedModel, "use_kernels") else {}
