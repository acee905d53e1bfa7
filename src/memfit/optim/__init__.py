"""memfit's own optimizers: GaLore family, AdamW with stochastic rounding, torch's AdamW with
bounded step scratch, layer-wise updates.

All are torch.optim.Optimizer subclasses whose state is tensors and plain numbers, so
`torch.load(..., weights_only=True)` of their state_dict restores them.
"""

from memfit.optim.adafactor import Adafactor
from memfit.optim.adamw import AdamW
from memfit.optim.bounded_adamw import BoundedAdamW
from memfit.optim.galore import GaLore
from memfit.optim.inner import INNER_CHOICES
from memfit.optim.layerwise import LayerwiseOptimizer
from memfit.optim.projectors import PROJECTOR_CHOICES
from memfit.optim.stochastic_rounding import stochastic_round_to_bf16

__all__ = [
    "INNER_CHOICES",
    "PROJECTOR_CHOICES",
    "Adafactor",
    "AdamW",
    "BoundedAdamW",
    "GaLore",
    "LayerwiseOptimizer",
    "stochastic_round_to_bf16",
]
