"""Text a language model writes after a prompt: transformers' ``generate`` with memfit's
settings, so that ``memfit generate`` and the sample answers training logs at each
evaluation decode the same way.

Greedy unless ``temperature > 0`` (then sampling, with nucleus ``top_p``). Every setting
is passed to ``generate`` explicitly: a model folder's ``generation_config.json`` (e.g.
an instruct model's ``do_sample: true, temperature: 0.2``) only fills in what is unset,
so greedy stays greedy whatever the folder says. Generation stops at ``max_new_tokens``
or at an end token: the tokenizer's eos and the ones the model's generation config names
(chat models end a turn with their own token, e.g. ``<|im_end|>``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Decoding:
    """How to choose each next token."""

    max_new_tokens: int = 128
    temperature: float = 0.0  # 0: greedy (the most likely token); above 0: sampling
    top_p: float = 1.0  # sampling: draw from the smallest set of tokens this likely
    seed: int | None = None  # sampling: the seed of torch's generator, for repeatable draws

    @property
    def samples(self) -> bool:
        return self.temperature > 0


def end_token_ids(model: nn.Module, tokenizer: Any) -> list[int]:
    """The ids that end an answer: the tokenizer's eos and the model's own end tokens."""
    found = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for token in configured if isinstance(configured, list) else [configured]:
        if token is not None and token not in found:
            found.append(token)
    return found


def generate_ids(model: nn.Module, tokenizer: Any, prompt_ids: list[int], decoding: Decoding,
                 streamer: Any | None = None) -> list[int]:
    """The ids ``model`` writes after ``prompt_ids`` (without them, the end token
    included if one was written). ``streamer``: a transformers streamer (e.g.
    ``TextStreamer``) that is handed each token as it comes."""
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # (1, prompt)
    settings: dict[str, Any] = {"do_sample": decoding.samples}
    if decoding.samples:
        settings.update(temperature=decoding.temperature, top_p=decoding.top_p)
        if decoding.seed is not None:
            torch.manual_seed(decoding.seed)
    else:  # a folder's sampling settings would only draw warnings next to do_sample=false
        settings.update(temperature=None, top_p=None, top_k=None)
    ends = end_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (ends or [0])[0]
    with torch.no_grad():
        output = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                max_new_tokens=decoding.max_new_tokens, eos_token_id=ends or None,
                                pad_token_id=pad, streamer=streamer, **settings)
    return output[0, len(prompt_ids):].tolist()  # (new,)


def answer_text(tokenizer: Any, ids: list[int]) -> str:
    """The written ids as text, without special tokens (the end token, padding)."""
    return tokenizer.decode(ids, skip_special_tokens=True)
