"""memory.offload_blocks in the planner's trace: the blocks the offload technique marked
(techniques/activation_offload.py's ``offload_in_blocks``, applied to the meta model by its
spec's plan_apply) push the trace's own emulated offload hooks while they run.

``trace_micro_batch`` offloads the whole forward or nothing; with memory.offload_blocks it
is asked for nothing and this context names its hooks to the marked blocks instead, bound
to the trace's counter: the ``LiveBytes`` dispatch mode active while the forward runs. So
what those blocks save counts as host bytes exactly as a whole-model offload's does, and
what everything else saves (embeddings, the other blocks, the head, the loss) stays on the
device, as in training.
"""

from __future__ import annotations

import contextlib

from torch.autograd.graph import saved_tensors_hooks
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from memfit.plan.trace import LiveBytes, _offload_hooks
from memfit.techniques.activation_offload import offloading_in_blocks


def traced_offload_in_blocks() -> contextlib.AbstractContextManager:
    """Open around ``trace_micro_batch``: the marked blocks offload into the trace."""
    return offloading_in_blocks(_hooks_of_the_running_trace)


def _hooks_of_the_running_trace() -> saved_tensors_hooks | contextlib.nullcontext:
    # Called from a block's forward pre-hook, inside the trace's `with live:`; outside a
    # trace (no LiveBytes on the stack) the block offloads nothing.
    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, LiveBytes):
            return _offload_hooks(mode)
    return contextlib.nullcontext()
