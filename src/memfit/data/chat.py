"""The "chat" format: conversations, learning only what the assistant says.

A row holds ``messages``: a list of ``{"role": str, "content": str}``. The conversation is
rendered to one string with the tokenizer's chat template when it has one
(``apply_chat_template(tokenize=False)``), else with the plain fallback: ``role: content``
per message, a newline between messages, eos right after each assistant reply, bos first
(bos/eos only where the tokenizer has them), e.g.::

    <s>user: Hi
    assistant: Hello</s>
    user: Thanks
    assistant: Bye</s>

Which characters are the assistant's is found by rendering prefixes: for an assistant
message k, its span starts where ``messages[:k]`` rendered with the generation prompt ends
(so the assistant header is context) and stops where ``messages[:k+1]`` rendered ends (so
the reply's end-of-turn markup is learned: the model must learn to stop). Both renderings
must be prefixes of the whole; a template that rewrites earlier turns fails with a
DataError. An assistant message that opens the conversation has no prompt to answer and
is kept as context. The spans cut the string into segments that are tokenized one by one,
so every token is wholly inside or outside the loss.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from memfit._utils.errors import DataError
from memfit.config.limits import MAX_TEMPLATE_RANGE
from memfit.data.read import Row
from memfit.data.tokens import IGNORE_INDEX, Encoded, bos_ids, tokenize

NEEDS = "'messages' (a list of {'role': str, 'content': str})"
ASSISTANT = "assistant"

Message = dict[str, str]


def messages_of(row: Row) -> list[Message]:
    """The row's messages, checked, reduced to role and content."""
    messages = row.values.get("messages")
    if messages is None:
        raise DataError(f"{row.where}: missing field 'messages'; this format needs {NEEDS}")
    if not isinstance(messages, list) or not messages:
        raise DataError(
            f"{row.where}: field 'messages' must be a non-empty list, got {messages!r:.60}"
        )
    checked = []
    for number, message in enumerate(messages, start=1):
        if not isinstance(message, dict) or not all(
            isinstance(message.get(key), str) for key in ("role", "content")
        ):
            raise DataError(
                f"{row.where}: message {number} must have string 'role' and 'content', "
                f"got {message!r:.80}"
            )
        # Columnar files fill keys that other rows have with None; templates must not see them.
        checked.append({"role": message["role"], "content": message["content"]})
    return checked


def render(tokenizer: Any, messages: list[Message], add_generation_prompt: bool) -> str:
    """The conversation as one string: the chat template, or the plain fallback."""
    if tokenizer.chat_template:
        with _bounded_ranges(tokenizer.get_chat_template()):
            return tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
    eos = tokenizer.eos_token or ""
    parts = [tokenizer.bos_token] if bos_ids(tokenizer) else []
    for number, message in enumerate(messages):
        separator = "\n" if number else ""
        end = eos if message["role"] == ASSISTANT else ""
        parts.append(f"{separator}{message['role']}: {message['content']}{end}")
    if add_generation_prompt:
        parts.append(("\n" if messages else "") + f"{ASSISTANT}: ")
    return "".join(parts)


def segments(tokenizer: Any, row: Row) -> list[tuple[str, bool]]:
    """The rendered conversation cut into (text, is_assistant_reply) pieces, in order."""
    import jinja2  # ~0.15 s: only chat data renders templates

    messages = messages_of(row)
    try:
        whole = render(tokenizer, messages, add_generation_prompt=False)
        spans = _assistant_spans(tokenizer, messages, whole, row)
    except (jinja2.TemplateError, OverflowError) as error:  # OverflowError: Jinja's range cap
        raise DataError(
            f"{row.where}: the tokenizer's chat template rejects this conversation: {error}"
        ) from error
    except RecursionError:  # a macro that calls itself without end
        raise DataError(
            f"{row.where}: the tokenizer's chat template recurses without end (Python's "
            f"recursion limit, {sys.getrecursionlimit()}, was reached); fix the template"
        ) from None
    pieces, done = [], 0
    for start, stop in spans:
        # Clamped so that an odd template can never make two pieces share characters.
        start = max(start, done)
        stop = max(stop, start)
        pieces += [(whole[done:start], False), (whole[start:stop], True)]
        done = stop
    pieces.append((whole[done:], False))
    return [(text, learned) for text, learned in pieces if text]


def encode(rows: Sequence[Row], tokenizer: Any) -> list[Encoded]:
    """Tokens of each conversation; everything but the assistant replies is IGNORE_INDEX."""
    pieces = [segments(tokenizer, row) for row in rows]
    # One tokenizer call for every piece of every row (fast tokenizers batch in Rust).
    piece_ids = iter(tokenize(tokenizer, [text for row_pieces in pieces for text, _ in row_pieces]))
    encoded = []
    for row_pieces in pieces:
        input_ids: list[int] = []
        labels: list[int] = []
        for _, learned in row_pieces:
            ids = next(piece_ids)
            input_ids += ids
            labels += ids if learned else [IGNORE_INDEX] * len(ids)
        encoded.append(Encoded(input_ids, labels))
    return encoded


class _RangeBudget:
    """``range`` for one rendering of a chat template, refusing once all its ranges
    together exceed MAX_TEMPLATE_RANGE iterations.

    Why this and not a time limit: a wall-clock limit depends on the machine, so the same
    data would pass on one and fail on another. Jinja's sandbox already caps each range at
    100,000 items (OverflowError), but not nested loops: range(99999) inside range(99999)
    renders for hours. Charging every range's length up front to one budget makes the
    refusal deterministic; real templates loop over the messages, or range() over their
    count, far below it. (Recursion is bounded by Python's recursion limit; repeating a
    string, ``"x" * n``, is not bounded here.)
    """

    def __init__(self) -> None:
        self.left = MAX_TEMPLATE_RANGE

    def __call__(self, *arguments: int) -> range:
        numbers = range(*arguments)
        if len(numbers) > self.left:
            import jinja2  # loaded already: transformers renders with it

            raise jinja2.exceptions.SecurityError(
                f"its range() calls loop more than memfit's limit of {MAX_TEMPLATE_RANGE:,} "
                f"times in one rendering (range({', '.join(map(str, arguments))}))")
        self.left -= len(numbers)
        return numbers


@contextlib.contextmanager
def _bounded_ranges(chat_template: str) -> Iterator[None]:
    """``range`` is a ``_RangeBudget`` while transformers renders ``chat_template``.

    transformers compiles each template once (an lru-cached Jinja Template, in its own
    sandboxed environment) and renders with that object; its globals are a ChainMap whose
    first map belongs to this template alone, so setting ``range`` there for the duration
    of one call changes nothing for anyone else. Without that private function (another
    transformers version), templates render with Jinja's per-range cap only.
    """
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        yield
        return
    own = _compile_jinja_template(chat_template).globals.maps[0]
    own["range"] = _RangeBudget()
    try:
        yield
    finally:
        del own["range"]


def _assistant_spans(
    tokenizer: Any, messages: list[Message], whole: str, row: Row
) -> list[tuple[int, int]]:
    """(start, stop) offsets in ``whole`` of each assistant reply that follows a message."""
    return [
        (
            _prefix_length(
                whole, render(tokenizer, messages[:k], add_generation_prompt=True), row, k
            ),
            _prefix_length(
                whole, render(tokenizer, messages[: k + 1], add_generation_prompt=False), row, k + 1
            ),
        )
        for k in range(1, len(messages))
        if messages[k]["role"] == ASSISTANT
    ]


def _prefix_length(whole: str, prefix: str, row: Row, count: int) -> int:
    if not whole.startswith(prefix):
        raise DataError(
            f"{row.where}: the tokenizer's chat template renders the first {count} messages "
            "differently from the start of the whole conversation, so the assistant replies "
            "cannot be located; use a template that keeps earlier turns unchanged"
        )
    return len(prefix)
