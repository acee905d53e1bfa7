"""One bench case in a process of its own, so its peak is not inflated by the cases
before it:

    python -m memfit.bench.case SPEC.json RESULT.json

SPEC.json holds ``{"case": name, "peer": a bench.peers loop or null, "config":
YAML-shaped mapping}`` (written by ``bench.runner.spawn``). memfit cases (peer null: the
suite's, and the strategies of ``memfit bench CONFIG``) run ``memfit.train`` on the
mapping and return the records of its metrics.jsonl; peers run their loop
(``bench.peers``) on the batches ``memfit.train`` would draw. RESULT.json gets
``{"records": [...]}``.
"""

from __future__ import annotations

import json
import sys
from itertools import islice
from pathlib import Path
from typing import Any

import torch

from memfit._utils.gc_thresholds import collect_less_often
from memfit.bench.process import write_result
from memfit.techniques.config_checks import from_mapping


def run_case(peer: str | None, mapping: dict[str, Any]) -> list[dict[str, Any]]:
    if peer is None:
        from memfit.monitor.metrics import read_metrics
        from memfit.training.api import train

        return [record for record in read_metrics(train(mapping).output_dir)
                if "loss" in record]
    from transformers import AutoTokenizer

    from memfit.bench.peers import batches_like_memfit, run_peer
    from memfit.training.build import seed_everything

    config = from_mapping(mapping)
    folder = Path(config.model.path)
    Path(config.train.output_dir).mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batches = list(islice(batches_like_memfit(config, tokenizer), config.train.max_steps))
    seed_everything(config.train.seed)  # as memfit.train does before building (LoRA init)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return run_peer(peer, folder, config, batches, device)


def main(argv: list[str]) -> int:
    collect_less_often()  # before the case imports transformers & co.
    spec_path, result_path = (Path(argument) for argument in argv)
    spec = json.loads(spec_path.read_text())
    records = run_case(spec["peer"], spec["config"])
    write_result(result_path, {"records": records})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
