"""data.pack for instruction and chat: whole rows first-fit into blocks, each row with its
own positions and loss mask; unset, only text packs."""

from __future__ import annotations

import pytest
import torch

from memfit.data import IGNORE_INDEX, build_datasets, collate, count_positions
from memfit.data.packing import first_fit

ROWS = [{"prompt": "what is two plus two?" * (1 + i % 3), "response": "four." * (1 + i % 4)}
        for i in range(9)]
CHATS = [{"messages": [{"role": "user", "content": "hello there" * (1 + i % 2)},
                       {"role": "assistant", "content": "how are you?" * (1 + i % 3)}]}
         for i in range(6)]


def test_first_fit_puts_each_row_in_the_first_block_with_room():
    assert first_fit([5, 4, 3, 2, 6, 1], 8) == [[0, 2], [1, 3, 5], [4]]
    assert first_fit([8, 8], 8) == [[0], [1]]
    assert first_fit([], 8) == []


@pytest.mark.parametrize("fmt, rows, length", [("instruction", ROWS, 48), ("chat", CHATS, 96)])
def test_packed_blocks_hold_whole_rows_apart(tmp_path, tokenizer, cfg, jsonl, fmt, rows,
                                             length):
    path = jsonl(tmp_path / "d.jsonl", rows)
    padded = build_datasets(cfg(path, fmt, max_length=length), tokenizer).train
    packed = build_datasets(cfg(path, fmt, max_length=length, pack=True), tokenizer).train
    assert len(packed) < len(padded) and "position_ids" not in padded[0]
    # Cut at the position restarts, the blocks give back every row, in first-fit order.
    pieces = []
    for block in (packed[i] for i in range(len(packed))):
        assert len(block["input_ids"]) <= length
        starts = (block["position_ids"] == 0).nonzero().flatten().tolist()
        for start, stop in zip(starts, [*starts[1:], len(block["input_ids"])], strict=True):
            assert block["position_ids"][start:stop].tolist() == list(range(stop - start))
            pieces.append((block["input_ids"][start:stop], block["labels"][start:stop]))
    order = [row for block in first_fit([len(padded[i]["input_ids"]) for i in
                                         range(len(padded))], length) for row in block]
    for (ids, labels), row in zip(pieces, order, strict=True):
        assert torch.equal(ids, padded[row]["input_ids"])
        # The loss mask is the row's own, and the row's first token is never a target.
        assert labels[0] == IGNORE_INDEX and torch.equal(labels[1:], padded[row]["labels"][1:])


def test_unset_pack_packs_text_only(tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", ROWS)
    instruction = build_datasets(cfg(path, "instruction", pack=None), tokenizer).train
    assert len(instruction) == len(ROWS) and "position_ids" not in instruction[0]
    text = jsonl(tmp_path / "t.jsonl", [{"text": row["prompt"]} for row in ROWS])
    blocks = build_datasets(cfg(text, "text", pack=None, max_length=16), tokenizer).train
    assert all(len(block["input_ids"]) == 16 for block in list(blocks)[:-1])


def test_padded_positions_pad_with_zero_and_are_counted(tmp_path, tokenizer, cfg, jsonl):
    path = jsonl(tmp_path / "d.jsonl", ROWS)
    packed = build_datasets(cfg(path, "instruction", max_length=48, pack=True), tokenizer).train
    batch = collate([packed[i] for i in range(len(packed))], pad_token_id=0)
    tokens = sum(len(packed[i]["input_ids"]) for i in range(len(packed)))
    assert count_positions(batch) == (tokens, batch["input_ids"].numel())
    assert (batch["position_ids"][batch["attention_mask"] == 0] == 0).all()
