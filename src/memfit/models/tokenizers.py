"""Tokenizers memfit builds itself, without a download.

Built-in presets start from random weights and have no tokenizer of their own, so they
get ``byte_level_tokenizer()``: one token per UTF-8 byte plus three special tokens. The
demo base model (``memfit.demo``) ships a BPE tokenizer trained on its corpus; both share
the special tokens and the chat template defined here, so data code never needs to know
which one it holds.

Ids, identical in both tokenizers:

- ``0`` ``<pad>``, ``1`` ``<s>`` (bos), ``2`` ``</s>`` (eos);
- byte-level tokenizer only: byte ``b`` is id ``b + 3``, so ids 3..258 and
  ``BYTE_VOCAB_SIZE == 259``.

Neither tokenizer inserts special tokens when encoding plain text (``encode`` is a pure
function of the text); the chat template adds ``<s>`` at the start and ``</s>`` after
every assistant turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
BYTE_OFFSET = len(SPECIAL_TOKENS)
BYTE_VOCAB_SIZE = BYTE_OFFSET + 256

# Renders "<s>User: ...\nAssistant: ...</s>User: ...\nAssistant: ...</s>".
# The generation prompt is "Assistant:" without the trailing space: the space belongs
# to the reply's first token, so the tokens of the prompt rendered with
# add_generation_prompt=True are an exact prefix of the tokens of the whole
# conversation (masking the prompt out of the loss relies on this). The
# {% generation %} block marks the reply and its eos for
# apply_chat_template(return_assistant_tokens_mask=True).
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- 'Assistant:' -}}"
    "{%- generation -%}{{- ' ' + message['content'] + eos_token -}}{%- endgeneration -%}"
    "{%- elif message['role'] in ['system', 'user'] -%}"
    "{{- message['role'] | capitalize + ': ' + message['content'] + '\\n' -}}"
    "{%- else -%}"
    "{{- raise_exception('chat roles are system, user and assistant; got ' + message['role']) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}"
)


def _byte_to_symbol() -> dict[int, str]:
    """The printable character that byte-level BPE uses to stand for each byte.

    Printable Latin-1 bytes stand for themselves; the 68 others (controls, space, DEL,
    NBSP, soft hyphen) are moved to code points 256.. in byte order. This is the alphabet
    of ``tokenizers.pre_tokenizers.ByteLevel``, which does not expose the mapping itself.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    mapping = {byte: chr(byte) for byte in printable}
    moved = (byte for byte in range(256) if byte not in mapping)
    mapping.update({byte: chr(256 + index) for index, byte in enumerate(moved)})
    return mapping


def as_transformers_tokenizer(backend: tokenizers.Tokenizer,
                              model_max_length: int) -> PreTrainedTokenizerFast:
    """Wrap a ``tokenizers`` backend whose ids 0, 1, 2 are ``SPECIAL_TOKENS``.

    Adds the chat template and marks the special tokens, so the result saves and loads
    with ``save_pretrained`` / ``AutoTokenizer.from_pretrained`` like any HF tokenizer.
    """
    for token_id, token in enumerate(SPECIAL_TOKENS):
        found = backend.token_to_id(token)
        if found != token_id:
            raise ValueError(f"tokenizer must map {token!r} to id {token_id}, not {found}")
    from transformers import PreTrainedTokenizerFast  # ~1 s: only when a tokenizer is made

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        model_max_length=model_max_length,
        chat_template=CHAT_TEMPLATE,
        # The default cleanup rewrites " ." to "." on decode and breaks round trips.
        clean_up_tokenization_spaces=False,
    )


def byte_level_tokenizer(model_max_length: int = 2048) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per UTF-8 byte; round-trips any string exactly."""
    vocab = {token: token_id for token_id, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({symbol: BYTE_OFFSET + byte for byte, symbol in _byte_to_symbol().items()})
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # No regex split: with no merges, words would only be cut into the same bytes.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return as_transformers_tokenizer(backend, model_max_length)
