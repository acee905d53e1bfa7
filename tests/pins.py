"""Pinned losses that depend on the CPU's kernels.

torch and bitsandbytes pick their CPU kernels by the instruction set
(``torch.backends.cpu.get_cpu_capability()``: bitsandbytes' CPU backend branches on AVX512,
and torch's vectorized reductions round differently per width). Most pinned losses agree
across machines within the tests' rel 1e-5; the few that do not are pinned per capability
as well: measured on 2026-12-05 on an AVX2 machine (AMD EPYC, torch 2.13.0, one thread) the
demo's QLoRA starts 5.5% lower (bitsandbytes quantizes the base differently) and 8-bit AdamW
and Lion drift by 6e-5 and 8e-5 over 10 steps.
"""

from __future__ import annotations

import torch

CPU_CAPABILITY = torch.backends.cpu.get_cpu_capability()


def pinned(case: str, pins: dict[str, list[float]],
           by_capability: dict[str, dict[str, list[float]]]) -> list[float]:
    """This machine's pins of ``case``: its capability's own where it has them, else the
    ones printed where they were first pinned."""
    return by_capability.get(CPU_CAPABILITY, {}).get(case, pins[case])
