"""Format "chat": only assistant replies are learned, with a template and without."""

from __future__ import annotations

import pytest

from memfit._utils.errors import DataError
from memfit.data import IGNORE_INDEX, build_datasets

CONVERSATION = [
    {"role": "system", "content": "be brief."},
    {"role": "user", "content": "what is two plus two?"},
    {"role": "assistant", "content": "four."},
    {"role": "user", "content": "and in french?"},
    {"role": "assistant", "content": "quatre."},
]


def learned_runs(example) -> list[list[int]]:
    """Maximal runs of consecutive learned label tokens."""
    runs, current = [], []
    for label in example["labels"].tolist():
        if label == IGNORE_INDEX:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(label)
    return runs + ([current] if current else [])


def test_with_template_learns_each_reply_and_its_end_of_turn(tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"messages": CONVERSATION}])
    example = build_datasets(cfg(path, "chat", max_length=256), tokenizer).train[0]
    whole = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert tokenizer.decode(example["input_ids"]) == whole
    assert [tokenizer.decode(run) for run in learned_runs(example)] == [
        "four.</s>\n",
        "quatre.</s>\n",
    ]


def test_without_template_uses_the_plain_fallback(tmp_path, plain_tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", [{"messages": CONVERSATION}])
    example = build_datasets(cfg(path, "chat", max_length=256), plain_tokenizer).train[0]
    assert plain_tokenizer.decode(example["input_ids"]) == (
        "<s>system: be brief.\nuser: what is two plus two?\nassistant: four.</s>\n"
        "user: and in french?\nassistant: quatre.</s>"
    )
    runs = [plain_tokenizer.decode(run) for run in learned_runs(example)]
    assert runs == ["four.</s>", "quatre.</s>"]


def test_an_opening_assistant_message_is_context(tmp_path, plain_tokenizer, cfg, jsonl):
    messages = [{"role": "assistant", "content": "hello."}, *CONVERSATION[1:3]]
    path = jsonl(tmp_path / "d.jsonl", [{"messages": messages}])
    example = build_datasets(cfg(path, "chat", max_length=256), plain_tokenizer).train[0]
    assert [plain_tokenizer.decode(run) for run in learned_runs(example)] == ["four.</s>"]


def test_a_template_that_rewrites_earlier_turns_is_rejected(tmp_path, cfg, jsonl, make_tokenizer):
    # Numbers each message by how many there are: every prefix renders differently.
    counting = make_tokenizer(
        "{% for m in messages %}{{ messages|length }}{{ m['content'] }}{% endfor %}"
    )
    path = jsonl(tmp_path / "d.jsonl", [{"messages": CONVERSATION[1:3]}])
    with pytest.raises(DataError, match=r"d.jsonl row 1: .*chat template"):
        build_datasets(cfg(path, "chat", max_length=256), counting)


def test_bad_messages_name_the_row(tmp_path, tokenizer, cfg, jsonl):
    rows = [{"messages": CONVERSATION[1:3]}, {"messages": [{"role": "user"}]}]
    path = jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(
        DataError, match=r"d.jsonl row 2: message 1 must have string 'role' and 'content'"
    ):
        build_datasets(cfg(path, "chat", max_length=256), tokenizer)
