"""For the whole suite: one compute thread per process, and a fixed device profile.

The README's test command runs 2 pytest-xdist workers on 2 cores, and many tests start
`memfit` subprocesses or 2-process torchrun jobs beside them. With torch's default (one
OpenMP thread per core) every process spins threads over cores the others hold: measured
on 2 otherwise idle cores, `python -m pytest -n 2 --dist loadfile` of
tests/regression/test_pinned_losses.py, tests/unit/techniques/test_tiled_mlp.py and
tests/unit/plan/test_long_context.py took 230.1 s with 2 threads per process and 27.5 s
with 1, with the same results (the pinned losses hold in both). Set before torch is
imported, so the subprocesses the tests start inherit it; a value the caller exported is
kept.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from memfit._utils.gc_thresholds import collect_less_often

# As the `memfit` command does (memfit._utils.gc_thresholds): ~1 s less per worker's imports.
collect_less_often()

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

# The planner prices step times with this machine's calibrated profile (memfit.plan.devices),
# which swings with the machine's load: the suite plans with a fixed one instead
# (cpu_profile.json: a 2-core CPU at 1 thread, MEMFIT_DEVICE_PROFILE), so recommendations
# that weigh time are the same on every run; tests of calibration set their own cache.
os.environ.setdefault("MEMFIT_DEVICE_PROFILE", str(Path(__file__).with_name("cpu_profile.json")))
os.environ.setdefault("MEMFIT_CACHE_DIR", tempfile.mkdtemp(prefix="memfit-tests-"))

import torch  # noqa: E402 -- after the thread count above

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

