"""A guard with numbers: the demo's first 10 training losses under a few strategies, pinned
to the digits printed on 2026-12-02 (torch 2.13.0, CPU). A refactor that changes what a
step computes fails here loudly; one that only moves code passes. The fsdp counterparts
on 2 processes are pinned in tests/distributed (test_fsdp_train, test_fsdp_lean).

If a change is meant to change the numbers (a new default, a fixed bug), re-pin them with
``python tests/regression/test_pinned_losses.py`` and say why in the commit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from memfit.demo.defaults import demo_config_path
from memfit.monitor.metrics import losses_by_step, read_metrics
from memfit.techniques.config_checks import load_config
from memfit.training.api import train

STEPS = 10
# Each case: the overrides on top of the demo (LoRA rank 8 on the pretrained demo base).
CASES: dict[str, list[str]] = {
    "default": [],
    "full-adamw": ["adapter.kind=none"],
    "qlora": ["adapter.kind=qlora"],
    "galore": ["adapter.kind=none", "optimizer.name=galore", "optimizer.galore.rank=4",
               "optimizer.galore.update_gap=4"],
    "layerwise-accumulating": ["adapter.kind=none", "optimizer.layerwise=true",
                               "train.micro_batch_size=4",
                               "train.gradient_accumulation_steps=2"],
}
PINNED: dict[str, list[float]] = {
    "default": [2.129750, 2.815511, 3.221728, 4.066552, 1.729627,
                2.040562, 2.023093, 2.371312, 1.329074, 1.360372],
    "full-adamw": [2.129750, 2.592146, 2.207429, 2.404975, 1.278277,
                   1.481633, 1.201089, 1.731704, 1.398219, 1.638945],
    "qlora": [2.221636, 2.934385, 3.464565, 3.997788, 1.758112,
              2.119676, 2.137639, 2.444302, 1.577506, 1.448191],
    "galore": [2.129750, 2.803818, 3.190114, 4.028457, 1.714524,
               2.029881, 2.099006, 2.763365, 1.325344, 1.453035],
    "layerwise-accumulating": [2.129750, 2.592151, 2.207357, 2.404001, 1.279422,
                               1.491723, 1.214669, 1.726215, 1.406305, 1.652572],
}


def demo_losses(case: str, root: Path) -> list[float]:
    config = load_config(demo_config_path(), [
        *CASES[case], f"train.max_steps={STEPS}", f"train.output_dir={root / case}",
        "train.eval_every=100", "train.save_every=100", "log.progress=false",
        "log.tensorboard=false"])
    train(config)
    return list(losses_by_step(read_metrics(root / case)).values())


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_demo_losses_are_the_pinned_ones(case: str, tmp_path: Path):
    assert demo_losses(case, tmp_path) == pytest.approx(PINNED[case], rel=1e-5)


if __name__ == "__main__":  # re-pin: prints the PINNED mapping to paste above
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        for name in CASES:
            values = ", ".join(f"{loss:.6f}" for loss in demo_losses(name, Path(folder)))
            print(f'    "{name}": [{values}],', file=sys.stderr)
