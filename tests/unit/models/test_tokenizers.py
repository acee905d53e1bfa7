"""The byte-level fallback tokenizer: exact round trips, fixed ids, the chat template."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from memfit.models.tokenizers import (
    BOS_ID,
    BYTE_OFFSET,
    BYTE_VOCAB_SIZE,
    EOS_ID,
    PAD_ID,
    byte_level_tokenizer,
)

CONVERSATION = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "Which bird dropped the cheese?"},
    {"role": "assistant", "content": "The Crow."},
    {"role": "user", "content": "And who ate it?"},
    {"role": "assistant", "content": "The Fox."},
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return byte_level_tokenizer()


@settings(max_examples=100, deadline=None)
@given(text=st.text())
def test_any_string_round_trips(tokenizer: PreTrainedTokenizerFast, text: str) -> None:
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    # Byte for byte, but for the text of a special token (next test), which hypothesis
    # now and then writes ("<s>"): that becomes the token, as in every transformers tokenizer.
    assume(not any(special in text for special in tokenizer.all_special_tokens))
    assert ids == [BYTE_OFFSET + byte for byte in text.encode("utf-8")]


def test_the_text_of_a_special_token_is_that_token(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = tokenizer.encode("a<s>b</s>")
    assert ids == [BYTE_OFFSET + ord("a"), tokenizer.bos_token_id, BYTE_OFFSET + ord("b"),
                   tokenizer.eos_token_id]
    assert tokenizer.decode(ids) == "a<s>b</s>"


@pytest.mark.parametrize("text", ["", " ", "a  b .", "\x00\x7f\n\t\r", "naïve 🦊 — 狐狸"])
def test_edge_strings_round_trip(tokenizer: PreTrainedTokenizerFast, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_ids_and_vocabulary(tokenizer: PreTrainedTokenizerFast) -> None:
    assert BYTE_VOCAB_SIZE == 259
    assert len(tokenizer) == BYTE_VOCAB_SIZE
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (
        PAD_ID, BOS_ID, EOS_ID) == (0, 1, 2)
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "<s>", "</s>"]
    # Plain text gets no special tokens; the literal text "<s>" still round-trips.
    assert BOS_ID not in tokenizer.encode("hello")
    assert tokenizer.decode(tokenizer.encode("<s>hi</s>"), skip_special_tokens=True) == "hi"
    assert tokenizer.decode([BOS_ID, *tokenizer.encode("hi"), EOS_ID],
                            skip_special_tokens=True) == "hi"


def test_chat_template_renders(tokenizer: PreTrainedTokenizerFast) -> None:
    rendered = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert rendered == (
        "<s>System: Answer in one word.\nUser: Which bird dropped the cheese?\n"
        "Assistant: The Crow.</s>User: And who ate it?\nAssistant: The Fox.</s>"
    )
    prompt = tokenizer.apply_chat_template(CONVERSATION[:2], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt.endswith("User: Which bird dropped the cheese?\nAssistant:")


def test_prompt_tokens_are_a_prefix_of_the_conversation(
        tokenizer: PreTrainedTokenizerFast) -> None:
    def ids(messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                             add_generation_prompt=add_generation_prompt
                                             )["input_ids"]

    prompt = ids(CONVERSATION[:2], add_generation_prompt=True)
    whole = ids(CONVERSATION[:3], add_generation_prompt=False)
    assert whole[:len(prompt)] == prompt
    assert tokenizer.decode(whole[len(prompt):]) == " The Crow.</s>"


def test_assistant_mask_covers_replies_and_eos(tokenizer: PreTrainedTokenizerFast) -> None:
    encoded = tokenizer.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
    masked = [token for token, keep in zip(encoded["input_ids"], encoded["assistant_masks"],
                                           strict=True)
              if keep]
    assert tokenizer.decode(masked) == " The Crow.</s> The Fox.</s>"


def test_unknown_role_is_rejected(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(Exception, match="tool"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_saves_and_loads_like_any_hf_tokenizer(tokenizer: PreTrainedTokenizerFast,
                                               tmp_path: Path) -> None:
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "Slow but steady wins the race. ✓"
    assert loaded.encode(text) == tokenizer.encode(text)
    assert loaded.decode(loaded.encode(text)) == text
    assert loaded.apply_chat_template(CONVERSATION, tokenize=False) == \
        tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert len(loaded) == BYTE_VOCAB_SIZE
