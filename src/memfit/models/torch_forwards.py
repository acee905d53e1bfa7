"""Models load with transformers' own forwards, not the kernels hub's.

transformers 5 kernelizes a model it loads whenever the ``kernels`` package is installed
(a dependency of transformers): a module whose class is decorated with
``use_kernel_forward_from_hub`` (Llama's RMSNorm, ...) gets a Hub kernel's forward where
one exists for the device, and each ``train()`` / ``eval()`` redoes that, dropping any
forward set on the instance: memfit's tiled norms ran untiled after ``model.train()``.
memfit's techniques set such forwards and its planner traces the torch code, so every
load of a pretrained model passes ``TORCH_FORWARDS``: what trains is what was planned,
offline too.
"""

from __future__ import annotations

TORCH_FORWARDS = {"use_kernels": False}
