"""A guard with numbers: the demo's first 10 training losses under a few strategies and
every registered optimizer, pinned to the digits printed on 2026-12-02 and 2026-12-04
(torch 2.13.0, CPU). A refactor that changes what a
step computes fails here loudly; one that only moves code passes. The fsdp counterparts
on 2 processes are pinned in tests/distributed (test_fsdp_train, test_fsdp_lean).

If a change is meant to change the numbers (a new default, a fixed bug), re-pin them with
``PYTHONPATH=tests python tests/regression/test_pinned_losses.py`` and say why in the commit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pins import pinned

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
    # Every other registered optimizer, training every weight (test below keeps the list
    # whole), and GaLore's APOLLO-Mini projector.
    "full-adamw8bit": ["adapter.kind=none", "optimizer.name=adamw8bit"],
    "full-adafactor": ["adapter.kind=none", "optimizer.name=adafactor"],
    "full-sgd": ["adapter.kind=none", "optimizer.name=sgd"],
    # Lion's sign updates take the step size of its tests (tests/integration/test_lion.py).
    "full-lion": ["adapter.kind=none", "optimizer.name=lion", "optimizer.lr=3e-4"],
    # CAME's first steps are ~10 x lr per weight (its confidence starts near 0): the
    # demo's 3e-3 diverges.
    "full-came": ["adapter.kind=none", "optimizer.name=came", "optimizer.lr=1e-4"],
    "apollo-mini": ["adapter.kind=none", "optimizer.name=galore",
                    "optimizer.galore.projector=apollo_mini", "optimizer.galore.update_gap=4"],
}
# Registered optimizers this CPU cannot run, and why.
NEEDS_CUDA = {"paged_adamw8bit": "pages its state between GPU and host memory"}
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
    # Pinned on 2026-12-04 (torch 2.13.0, CPU, one thread).
    "full-adamw8bit": [2.129750, 2.592146, 2.207406, 2.405274, 1.278525,
                       1.481583, 1.201758, 1.732365, 1.397882, 1.637301],
    "full-adafactor": [2.129750, 2.813415, 3.227192, 4.074726, 1.745815,
                       2.141141, 2.193601, 2.852127, 1.534763, 1.628147],
    "full-sgd": [2.129750, 2.829006, 3.295864, 4.238915, 1.888710,
                 2.363654, 2.652323, 3.481874, 1.928748, 2.280500],
    "full-lion": [2.129750, 2.805163, 3.184222, 3.975016, 1.657221,
                  1.960855, 1.863681, 2.326560, 1.311509, 1.289155],
    # Pinned on 2026-12-05 (torch 2.13.0, CPU, one thread; an AVX2 machine, where the
    # default kernels print the same digits).
    "full-came": [2.129749, 2.720577, 2.673115, 2.788459, 1.155195,
                  1.415232, 1.245926, 1.620256, 1.351277, 1.483177],
    "apollo-mini": [2.129750, 2.805871, 3.209004, 4.066886, 1.748747,
                    2.116436, 2.237720, 3.004798, 1.459372, 1.688909],
}
# Where an AVX2 machine's kernels print other digits (tests/pins.py).
PINNED_BY_CAPABILITY: dict[str, dict[str, list[float]]] = {
    "AVX2": {
        "full-adamw8bit": [2.129749, 2.592149, 2.207407, 2.405272, 1.278521,
                           1.481585, 1.201762, 1.732319, 1.397932, 1.637396],
        "full-lion": [2.129749, 2.805164, 3.184219, 3.975020, 1.657217,
                      1.960821, 1.863710, 2.326667, 1.311566, 1.289257],
        "qlora": [2.099423, 2.852250, 3.296075, 3.957573, 1.732778,
                  2.019419, 1.991125, 2.383587, 1.393964, 1.375660],
    },
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
    expected = pinned(case, PINNED, PINNED_BY_CAPABILITY)
    assert demo_losses(case, tmp_path) == pytest.approx(expected, rel=1e-5)


def test_every_registered_optimizer_has_pinned_losses():
    from memfit.techniques.optimizers import SPECS

    optimizers = {override.partition("=")[2] for overrides in CASES.values()
                  for override in overrides if override.startswith("optimizer.name=")}
    optimizers.add("adamw")  # the demo's own
    assert set(SPECS) - set(NEEDS_CUDA) == optimizers, "pin the demo's losses of a new optimizer"


if __name__ == "__main__":  # re-pin: prints the PINNED mapping to paste above (or, for
    # a case whose digits differ on this machine's CPU capability, into PINNED_BY_CAPABILITY)
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        for name in CASES:
            values = ", ".join(f"{loss:.6f}" for loss in demo_losses(name, Path(folder)))
            print(f'    "{name}": [{values}],', file=sys.stderr)
