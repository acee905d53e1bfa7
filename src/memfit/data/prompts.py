"""A prompt to answer, as the tokens a trained model saw before the text it learned to
write: the context half of a training example of each token format.

- chat: one user message rendered with the generation prompt (the tokenizer's chat
  template when it has one, else chat.py's plain fallback), e.g. ``<s>User: Hi\\nAssistant:``;
- instruction: ``[bos] prompt "\\n"`` (instruction.py's template up to the response);
- text: ``[bos] prompt``, to be continued (a document's start, text.py).
"""

from __future__ import annotations

from typing import Any

from memfit.config.choices import TOKEN_FORMATS
from memfit.config.schema import DataFormat
from memfit.data import chat, instruction
from memfit.data.read import Row
from memfit.data.tokens import bos_ids, tokenize

PROMPT_FORMATS = tuple(sorted(format_.value for format_ in TOKEN_FORMATS))


def prompt_ids(tokenizer: Any, data_format: DataFormat, prompt: str) -> list[int]:
    """The token ids of ``prompt`` laid out as ``data_format`` (one of TOKEN_FORMATS)
    lays out the context of an example."""
    if data_format is DataFormat.CHAT:
        row = Row("the prompt", {"messages": [{"role": "user", "content": prompt}]})
        text = chat.render(tokenizer, chat.messages_of(row), add_generation_prompt=True)
        return tokenize(tokenizer, [text])[0]
    if data_format is DataFormat.INSTRUCTION:
        return bos_ids(tokenizer) + tokenize(tokenizer, [prompt + instruction.PROMPT_SEPARATOR])[0]
    if data_format is DataFormat.TEXT:
        return bos_ids(tokenizer) + tokenize(tokenizer, [prompt])[0]
    raise ValueError(f"data.format={data_format.value} has no prompts; one of "
                     f"{', '.join(PROMPT_FORMATS)} has")
