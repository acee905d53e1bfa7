"""memfit's own processes run CPython's cyclic garbage collector less often.

Importing torch, transformers and peft makes hundreds of thousands of objects that live
as long as the process, and with CPython's default thresholds (700, 10, 10) the collector
walks them again and again: measured on this project's 2-core machine, ``import torch,
transformers, peft; from transformers import LlamaForCausalLM`` took 7.1-7.5 s with the
defaults and 6.0-6.2 s with ``THRESHOLDS`` (a tiny Llama's `memfit plan`: 11.8-12.3 s ->
11.4-11.5 s). Garbage is still collected, less often. Applied by the processes memfit
starts itself (the ``memfit`` command, its workers, bench cases), never on import of the
library: a program that imports memfit keeps its own settings.
"""

from __future__ import annotations

import gc

CPYTHON_DEFAULTS = (700, 10, 10)
THRESHOLDS = (10_000, 50, 50)


def collect_less_often() -> None:
    """``THRESHOLDS``, unless the process already chose thresholds of its own."""
    if gc.get_threshold() == CPYTHON_DEFAULTS:
        gc.set_threshold(*THRESHOLDS)
