"""How a token batch reaches a causal LM: padded rows with their attention mask, or packed
blocks whose rows must not see each other (data.pack with instruction or chat).

A packed batch carries ``position_ids`` that restart at 0 with each row
(``data.tokens.pack_rows``). It goes in with them, WITHOUT an attention mask and with
``use_cache=False``: transformers finds the rows of each block where the positions restart
(``masking_utils.find_packed_sequence_indices``) only when there is neither a mask nor a
cache (a causal LM makes itself a DynamicCache when ``config.use_cache``, as most ship),
and then, under sdpa, eager or flex attention, builds a block-diagonal causal mask
[batch, 1, L, L].

Flash attention (flash_attention_2/3, the kernels hub's) takes no such mask; it reads
packed rows from the position ids (varlen kernels, cu_seqlens from the restarts) only when
the batch is ONE row (``modeling_flash_attention_utils._is_packed_sequence``). There the
micro-batch is flattened: its real tokens, padding dropped, as one [1, tokens] row, the
labels alike, so no padding is computed at all. Either way the loss is the unpacked one:
each row's first label is -100, so no position predicts across a join. (memfit loads
models with the attention implementation transformers picks, sdpa by default. The
flattened row is tested on CPU through sdpa, which reads the same restarts; the flash
kernels themselves need CUDA and are not exercised by the test suite.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

ModelInputs = dict[str, torch.Tensor | bool | None]


def causal_lm_inputs(model: nn.Module, batch: dict[str, Any]
                     ) -> tuple[ModelInputs, torch.Tensor]:
    """(the keyword arguments of ``model``'s forward, the labels aligned with its logits)
    for a (batch, L) token batch."""
    if batch.get("position_ids") is None:
        return ({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]},
                batch["labels"])
    if uses_flash_attention(model):
        return flattened(batch)
    return ({"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
             "attention_mask": None, "use_cache": False}, batch["labels"])


def flattened(batch: dict[str, Any]) -> tuple[ModelInputs, torch.Tensor]:
    """A packed (batch, L) micro-batch as one [1, tokens] row of its real tokens (those
    with attention_mask 1), with their position ids and labels."""
    real = batch["attention_mask"].bool()  # [batch, L]
    return ({"input_ids": batch["input_ids"][real][None],
             "position_ids": batch["position_ids"][real][None], "attention_mask": None,
             "use_cache": False}, batch["labels"][real][None])


def uses_flash_attention(model: nn.Module) -> bool:
    """Whether ``model`` (a transformers model, or a PEFT wrapper of one) runs a flash
    attention kernel: its ``config._attn_implementation`` names one."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return isinstance(implementation, str) and "flash" in implementation
