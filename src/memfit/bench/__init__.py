"""``memfit bench``: memory, speed and quality of memfit's strategies side by side with
the tools people use today (plain PyTorch, bitsandbytes, PEFT, galore-torch, the Hugging
Face Trainer), measured in one run on the same model, data and seed.

``run_bench`` (bench.runner) is the entry point; each case runs in its own process
(bench.case) so that its peak is its own.
"""

from memfit.bench.runner import BenchResult, run_bench

__all__ = ["BenchResult", "run_bench"]
