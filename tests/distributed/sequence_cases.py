"""The cases of the sequence-parallel tests (test_sequence_parallel.py on 2 processes,
test_sequence_groups.py on 4): configs of the tiny Llama (4 heads, 2 key/value heads,
fp32) for one process or for processes sharing each sequence."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from dist_helpers import run_config

STEPS = 3
# The full cases train the tiled norms' weights too, sharded by FSDP2 in full-fsdp.
TECHNIQUES = {"gradient_checkpointing": True, "chunked_loss": True, "loss_chunk_tokens": 16,
              "tiled_mlp": True, "mlp_chunk_tokens": 8, "tiled_norms": True,
              "norm_chunk_tokens": 8}
CASES = {
    "lora": {"adapter": {"kind": "lora", "rank": 4}, "memory": TECHNIQUES},
    "full": {"optimizer": {"name": "adamw", "lr": 1e-3}, "memory": TECHNIQUES},
    # FSDP2 over all processes (the chunked loss runs as the root unit's forward method).
    "lora-fsdp": {"adapter": {"kind": "lora", "rank": 4}, "memory": TECHNIQUES},
    "full-fsdp": {"optimizer": {"name": "adamw", "lr": 1e-3}, "memory": TECHNIQUES},
    # Rows packed into blocks, position ids restarting at each row (a block-diagonal mask).
    "packed": {"adapter": {"kind": "lora", "rank": 4},
               "data": {"format": "instruction", "pack": True}},
}


def write_instruction_rows(path: Path, rows: int = 40) -> Path:
    """Prompt/response rows of different lengths (the prompt is masked out of the loss)."""
    words = ["north", "amber", "quartz", "meadow", "signal", "harbor", "linen", "cedar"]
    with path.open("w") as handle:
        for index in range(rows):
            prompt = " ".join(words[(index + k) % len(words)] for k in range(1 + index % 3))
            response = " ".join(words[(index * 5 + k) % len(words)] for k in range(1 + index % 4))
            handle.write(json.dumps({"prompt": prompt, "response": response}) + "\n")
    return path


def case_config(root: Path, name: str, data: Path, case: str, sequence_parallel: int,
            micro_batch_size: int = 3) -> Path:
    sections = {key: value for key, value in CASES[case].items() if key != "data"}
    strategy = "fsdp" if case.endswith("-fsdp") else "ddp"
    distributed = ({"strategy": strategy, "sequence_parallel": sequence_parallel}
                   if sequence_parallel > 1 else {"strategy": "none"})
    path = run_config(root, name, data, **sections, distributed=distributed, train={
        "max_steps": STEPS, "micro_batch_size": micro_batch_size,
        "gradient_accumulation_steps": 2,
        "save_every": 1 if case == "lora" else STEPS, "eval_every": 0})
    mapping = yaml.safe_load(path.read_text())  # run_config's `data` is the data file
    mapping["data"].update(max_length=48, **CASES[case].get("data", {}))
    path.write_text(yaml.safe_dump(mapping))
    return path
