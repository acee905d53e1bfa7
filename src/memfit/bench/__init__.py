"""``memfit bench``: memory, speed and quality of memfit's strategies side by side with
the tools people use today (plain PyTorch, bitsandbytes, PEFT, galore-torch, the Hugging
Face Trainer), measured in one run on the same model, data and seed; or, with a config
(bench.job), the user's own job under the strategies the planner names.

``run_bench`` (bench.runner) is the entry point; each case runs in its own process
(bench.case) so that its peak is its own. Imported on first use (PEP 562), so that
``memfit.bench.defaults`` stays light for the command line's help.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BenchResult", "run_bench"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from memfit.bench import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'memfit.bench' has no attribute {name!r}")
