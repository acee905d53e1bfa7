"""The "text" format: causal language modelling on plain documents.

A document is the string in ``data.text_field`` of a row (a paragraph of a .txt file, see
read.py). Its tokens are ``[bos] + text + [eos]`` (bos only when the tokenizer has one
distinct from eos) and every token is in the loss. Packing, truncation and the eval split
happen in build.py; the eos at the end of each document is what separates packed documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memfit.data.read import Row
from memfit.data.tokens import Encoded, bos_ids, eos_ids, require_string, tokenize


def encode(rows: Sequence[Row], tokenizer: Any, text_field: str) -> list[Encoded]:
    """Tokens of each document, all of them labels."""
    needs = f"'{text_field}' (data.text_field)"
    texts = [require_string(row.values, text_field, row.where, needs) for row in rows]
    first, last = bos_ids(tokenizer), eos_ids(tokenizer)
    encoded = []
    for ids in tokenize(tokenizer, texts):
        document = first + ids + last
        encoded.append(Encoded(document, list(document)))
    return encoded
