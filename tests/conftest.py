"""For the whole suite: one compute thread per process, and a calibration cache of its own.

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

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

# The planner calibrates this machine once for its step times (memfit.plan.devices): into a
# cache of the suite's own, not the user's, shared by the workers and kept between runs.
os.environ.setdefault("MEMFIT_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), f"memfit-tests-{os.getuid()}"))

import torch  # noqa: E402 -- after the thread count above

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
