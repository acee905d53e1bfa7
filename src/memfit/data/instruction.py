"""The "instruction" format: a prompt, and the response the model should learn to give.

A row holds either ``prompt`` and ``response``, or the Alpaca layout ``instruction``,
optional ``input`` and ``output`` (prompt = instruction, or instruction + "\\n\\n" + input
when input is non-empty). The template is::

    [bos] prompt "\\n" | response [eos]

Everything left of ``|`` is masked out of the loss; the response and eos are in it. The
prompt (with its newline) and the response are tokenized separately, so the boundary
between masked and learned tokens is exact whatever the tokenizer merges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memfit.data.read import Row
from memfit.data.tokens import IGNORE_INDEX, Encoded, bos_ids, eos_ids, require_string, tokenize

NEEDS = "'prompt' and 'response', or 'instruction', 'output' and optionally 'input'"
PROMPT_SEPARATOR = "\n"


def prompt_and_response(row: Row) -> tuple[str, str]:
    """The prompt text (without the separator) and the response text of one row."""
    values = row.values
    if values.get("prompt") is not None or values.get("instruction") is None:
        return (
            require_string(values, "prompt", row.where, NEEDS),
            require_string(values, "response", row.where, NEEDS),
        )
    instruction = require_string(values, "instruction", row.where, NEEDS)
    output = require_string(values, "output", row.where, NEEDS)
    has_input = values.get("input") is not None
    extra = require_string(values, "input", row.where, NEEDS) if has_input else ""
    prompt = f"{instruction}\n\n{extra}" if extra else instruction
    return prompt, output


def encode(rows: Sequence[Row], tokenizer: Any) -> list[Encoded]:
    """Tokens of each row; prompt tokens labelled IGNORE_INDEX."""
    pairs = [prompt_and_response(row) for row in rows]
    prompts = tokenize(tokenizer, [prompt + PROMPT_SEPARATOR for prompt, _ in pairs])
    responses = tokenize(tokenizer, [response for _, response in pairs])
    first, last = bos_ids(tokenizer), eos_ids(tokenizer)
    encoded = []
    for prompt_ids, response_ids in zip(prompts, responses, strict=True):
        context = first + prompt_ids
        target = response_ids + last
        encoded.append(Encoded(context + target, [IGNORE_INDEX] * len(context) + target))
    return encoded
