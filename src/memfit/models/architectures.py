"""Configs of published architectures (sizes only, no weights), for planning.

Only the numbers that decide memory are set (vocabulary, widths, depth, heads, tying,
attention variants); everything else keeps the transformers default. Building one of
these for real allocates the full model, so ``memfit train`` refuses those that do not
fit the machine; ``memfit plan`` builds them on the meta device and allocates nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

# Each builder imports its config class when called: transformers takes ~2.5 s to import
if TYPE_CHECKING:
    from transformers import (
        Gemma2Config,
        GPT2Config,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        PretrainedConfig,
        Qwen2Config,
    )


def _llama(vocab: int, hidden: int, intermediate: int, layers: int, heads: int,
           kv_heads: int, positions: int) -> Callable[[], LlamaConfig]:
    def build() -> LlamaConfig:
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                           num_hidden_layers=layers, num_attention_heads=heads,
                           num_key_value_heads=kv_heads, max_position_embeddings=positions,
                           tie_word_embeddings=False)
    return build


def mistral_7b() -> MistralConfig:
    """Mistral-7B-v0.1: grouped-query attention (8 KV heads), 4096-token sliding window."""
    from transformers import MistralConfig

    return MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         max_position_embeddings=32768, sliding_window=4096,
                         tie_word_embeddings=False)


def qwen2_5_7b() -> Qwen2Config:
    """Qwen2.5-7B: biased q/k/v projections, 152k vocabulary, 4 KV heads."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       max_position_embeddings=32768, tie_word_embeddings=False)


def gemma_2_9b() -> Gemma2Config:
    """Gemma-2-9B: 256k tied vocabulary, head_dim 256, logit soft-capping (which makes
    transformers use eager attention, storing the attention probabilities)."""
    from transformers import Gemma2Config

    return Gemma2Config(vocab_size=256000, hidden_size=3584, intermediate_size=14336,
                        num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8,
                        head_dim=256, max_position_embeddings=8192, sliding_window=4096,
                        query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                        final_logit_softcapping=30.0, tie_word_embeddings=True)


def phi_3_mini() -> Phi3Config:
    """Phi-3-mini-4k: fused qkv and gate/up projections, 3.8B parameters."""
    from transformers import Phi3Config

    return Phi3Config(vocab_size=32064, hidden_size=3072, intermediate_size=8192,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                      max_position_embeddings=4096, tie_word_embeddings=False,
                      pad_token_id=32000)


def gpt2() -> GPT2Config:
    """GPT-2 small (124M): learned positions, tied 50257-token embedding."""
    from transformers import GPT2Config

    return GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)


ARCHITECTURES: dict[str, Callable[[], PretrainedConfig]] = {
    "llama-2-7b": _llama(32000, 4096, 11008, 32, 32, 32, 4096),
    "llama-2-13b": _llama(32000, 5120, 13824, 40, 40, 40, 4096),
    "llama-2-70b": _llama(32000, 8192, 28672, 80, 64, 8, 4096),
    "llama-3.1-8b": _llama(128256, 4096, 14336, 32, 32, 8, 131072),
    "mistral-7b": mistral_7b,
    "qwen2.5-7b": qwen2_5_7b,
    "gemma-2-9b": gemma_2_9b,
    "phi-3-mini": phi_3_mini,
    "gpt2": gpt2,
}
