"""Sequence-tiled norms (techniques/tiled.py): every RMSNorm / LayerNorm runs over
``chunk_tokens`` tokens at a time, so it keeps only its input for backward.

Why: Llama's RMSNorm computes in fp32 (``hidden.to(float32)``, its square, the
normalised value) and autograd saves the fp32 copy of its input, so each of a block's two
norms holds ``tokens x hidden x 4`` bytes through the block's backward, and its backward
makes three or four more fp32 ``[tokens, hidden]`` temporaries. For Llama-3.1-8B with
checkpointing, offload and the tiled MLP that was ~80 KB of the ~185 KB each extra token
cost on the device (plan trace, 16K -> 32K tokens). Tiled, a norm saves its bf16 input (a
block's input, kept anyway, or the residual sum) and its fp32 work exists for one chunk.

The norms are the modules whose class name ends in ``RMSNorm`` or ``LayerNorm``
(LlamaRMSNorm, Qwen2RMSNorm, MistralRMSNorm, GemmaRMSNorm, ``nn.LayerNorm``, ...), the
outermost only. A norm inside a tiled MLP sees one chunk and runs untiled.
"""

from __future__ import annotations

from memfit.techniques.tiled import Tiling

NORMS = Tiling(key="memory.tiled_norms", suffixes=("rmsnorm", "layernorm"),
               named="RMSNorm or LayerNorm", what="norm")
