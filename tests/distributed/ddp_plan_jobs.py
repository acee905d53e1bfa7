"""A worker for the data-parallel plan-vs-measured test, started once by torchrun: it
trains each config of a JSON list one after the other (the cases share one start-up of
torch and transformers), each in a process group of its own, and writes this rank's
highest measured training step (``RunResult.peak_bytes``, and the host bytes offload held
in it, ``RunResult.host_peak_bytes``) to ``OUT/NAME.rank-R.json``, NAME being the config
file's stem.

    python -m torch.distributed.run --standalone --nproc-per-node=2 ddp_plan_jobs.py \
        CONFIGS.json OUT
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ddp_jobs import join_group_for

from memfit._utils.gc_thresholds import collect_less_often
from memfit.training.api import train


def main(configs_file: str, out: str) -> None:
    collect_less_often()  # as memfit's own workers do, before transformers is imported
    rank = os.environ["RANK"]  # torchrun's; train() leaves no process group to ask
    for index, config in enumerate(json.loads(Path(configs_file).read_text())):
        join_group_for(index)
        result = train(config)
        Path(out, f"{Path(config).stem}.rank-{rank}.json").write_text(
            json.dumps({"peak_bytes": result.peak_bytes,
                        "host_peak_bytes": result.host_peak_bytes}))


if __name__ == "__main__":
    main(*sys.argv[1:])
