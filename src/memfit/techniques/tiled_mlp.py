"""Sequence-tiled MLP (techniques/tiled.py): each block's MLP runs over ``chunk_tokens``
tokens at a time, so its ``tokens x intermediate`` activations (Llama-3.1-8B: 14,336 per
token, gate, up, their product and the adapters' inputs) exist for one chunk at a time.

The MLPs are the modules whose class name ends in ``MLP`` (LlamaMLP, MistralMLP,
Qwen2MLP, Phi3MLP, GPT2MLP, GPTNeoXMLP, ... and a factory model's own), outermost only.
"""

from __future__ import annotations

from memfit.techniques.tiled import Tiling

MLPS = Tiling(key="memory.tiled_mlp", suffixes=("mlp",), named="MLP", what="MLP")
