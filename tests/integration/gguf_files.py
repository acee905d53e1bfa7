"""A tiny Llama written as a GGUF file with the ``gguf`` package, as llama.cpp's
convert_hf_to_gguf.py writes one: the metadata transformers maps to a LlamaConfig
(integrations/ggml.py), llama.cpp's tensor names, q/k rows permuted for its rotary
layout (transformers' LlamaTensorProcessor undoes it), and memfit's byte-level vocabulary
as a "gpt2" (byte-level BPE) tokenizer, with GPT-2's <|endoftext|> as its last token
(transformers' GPT2Tokenizer adds that token when a vocabulary lacks it).

The same model is saved as a Hugging Face folder too, so tests can compare the two."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from memfit.models.presets import tiny_llama
from memfit.models.tokenizers import (
    BOS_ID,
    BYTE_VOCAB_SIZE,
    CHAT_TEMPLATE,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    byte_level_tokenizer,
)

ENDOFTEXT = "<|endoftext|>"

# transformers' Llama parameter names (layer-less) -> llama.cpp's
_BLOCK_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _gguf_name(name: str) -> str | None:
    """llama.cpp's name of a transformers Llama weight; None for the tied lm_head."""
    top = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": None}
    if name in top:
        return top[name]
    _, _, layer, *rest = name.split(".")  # model.layers.N.self_attn.q_proj.weight
    return f"blk.{layer}.{_BLOCK_NAMES['.'.join(rest[:-1])]}.{rest[-1]}"


def _rotary_interleaved(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order: each head's two rotary halves interleaved."""
    rows = weight.shape[0]
    return (weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_tiny_llama_gguf(file: Path, hf_folder: Path | None = None, seed: int = 0) -> Path:
    """``file``: a 2-layer Llama (hidden 64) with random weights, in F32 tensors;
    ``hf_folder``: the same model and tokenizer as a Hugging Face folder."""
    import gguf
    from transformers import LlamaForCausalLM

    config = tiny_llama()
    config.vocab_size = BYTE_VOCAB_SIZE + 1  # and <|endoftext|>
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    tokenizer = byte_level_tokenizer()
    writer = gguf.GGUFWriter(str(file), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocabulary = tokenizer.get_vocab()
    tokens = [*sorted(vocabulary, key=vocabulary.get), ENDOFTEXT]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if token in (*SPECIAL_TOKENS, ENDOFTEXT)
                            else gguf.TokenType.NORMAL for token in tokens])
    writer.add_token_scores([0.0] * len(tokens))  # transformers rebuilds merges from scores
    writer.add_token_merges([])  # one token per byte: nothing to merge
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_pad_token_id(PAD_ID)
    writer.add_chat_template(CHAT_TEMPLATE)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    for name, tensor in model.state_dict().items():
        gguf_name = _gguf_name(name)
        if gguf_name is None:
            continue
        weight = tensor.float().numpy()
        kind = gguf_name.split(".")[-2]
        if kind in heads:
            weight = _rotary_interleaved(weight, heads[kind])
        writer.add_tensor(gguf_name, np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if hf_folder is not None:
        model.save_pretrained(hf_folder)
        tokenizer.save_pretrained(hf_folder)
    return file
