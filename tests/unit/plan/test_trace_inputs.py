"""The planner's trace cache is keyed on what the trace reads (plan/trace_inputs.py): a key
it reads splits an entry, one it does not read shares it, and equal values of another
type (1 and 1.0) stay apart."""

from __future__ import annotations

import json
from dataclasses import dataclass

from memfit._utils.exact_key import exact_key
from memfit.plan import estimate, itemize
from memfit.plan.planner import as_config


@dataclass(frozen=True)
class _Blocks:
    count: int | float
    own: dict


def test_exact_key_keeps_equal_values_of_other_types_apart():
    assert exact_key(_Blocks(1, {"a": 1})) == exact_key(_Blocks(1, {"a": 1}))
    keys = {exact_key(_Blocks(count, {})) for count in (1, 1.0, True)}
    assert len(keys) == 3
    assert exact_key(_Blocks(2, {"a": 1})) != exact_key(_Blocks(2, {"a": 1.0}))
    assert exact_key((1, [2])) != exact_key((1, (2,)))


def _classifier(path) -> dict:
    return {"model": {"preset": "tiny-llama", "task": "sequence-classification"},
            "adapter": {"kind": "none"},
            "data": {"path": str(path), "format": "classification", "max_length": 16}}


def _rows(path, classes: int):
    path.write_text("".join(json.dumps({"text": f"row {index}", "label": f"c{index % classes}"})
                            + "\n" for index in range(4 * classes)))
    return path


def test_a_classifiers_head_follows_its_data_in_one_process(tmp_path, monkeypatch):
    """The head has a row per class of data.path: planning a 2-class and then a 5-class file
    gives what planning the 5-class file alone gives."""
    two = estimate(as_config(_classifier(_rows(tmp_path / "two.jsonl", 2))), "cpu")
    five_path = _rows(tmp_path / "five.jsonl", 5)
    five = estimate(as_config(_classifier(five_path)), "cpu")
    monkeypatch.setattr(itemize, "_TRACE_CACHE", {})
    monkeypatch.setattr(itemize, "_SIZING_CACHE", {})
    alone = estimate(as_config(_classifier(five_path)), "cpu")
    assert five.bytes == alone.bytes
    assert five.bytes["weights"] > two.bytes["weights"]


def test_what_the_trace_does_not_read_shares_its_entry(monkeypatch):
    """The optimizer, the accumulation and the strategy do not change the traced micro-batch:
    one trace serves them all; the micro-batch and the checkpointed blocks do."""
    monkeypatch.setattr(itemize, "_TRACE_CACHE", {})
    base = {"model": {"preset": "tiny-llama"}, "data": {"max_length": 16},
            "distributed": {"nproc": 2}}

    def traces_after(**sections) -> int:
        estimate(as_config({**base, **sections}), "cpu")
        return len(itemize._TRACE_CACHE)

    assert traces_after() == 1
    assert traces_after(optimizer={"name": "adafactor"},
                        train={"gradient_accumulation_steps": 4}) == 1
    assert traces_after(distributed={"nproc": 2, "strategy": "fsdp"}) == 1
    assert traces_after(train={"micro_batch_size": 2}) == 2
    assert traces_after(memory={"gradient_checkpointing": True,
                                "checkpoint_blocks": 1}) == 3
    assert traces_after(memory={"gradient_checkpointing": True,
                                "checkpoint_blocks": 1.0}) == 4
