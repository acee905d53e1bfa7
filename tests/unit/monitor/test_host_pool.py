"""The tracker's host pool: storages memfit places on the host are counted there, apart from
the device's totals, categories, peak and budget, and never in both."""

from __future__ import annotations

import torch
from torch import nn

from memfit.accounting import host_allocations, mark_host
from memfit.monitor.tensor_tracker import TensorTracker

FP32 = 4


def test_storages_made_inside_host_allocations_are_host_and_outside_the_budget():
    tracker = TensorTracker(budget_bytes=1000)
    with tracker:
        device = torch.ones(100)  # 400 bytes
        with host_allocations():
            host = torch.zeros(1000)  # 4000 bytes: over the device budget, but not the device's
            host.add_(1)
        copy = host[:100].clone()  # outside: a device tensor again
    assert tracker.live_bytes == device.nbytes + copy.nbytes == 800
    assert tracker.host_live_bytes == tracker.host_peak_bytes == host.nbytes
    assert tracker.peak_bytes == 800
    assert sum(tracker.peak_by_category().values()) == tracker.peak_bytes
    del host
    assert tracker.host_live_bytes == 0 and tracker.host_peak_bytes == 4000
    tracker.reset_peak()
    assert tracker.host_peak_bytes == 0


def test_a_tagged_tensor_is_counted_as_host_when_the_tracker_first_meets_it():
    model = nn.Linear(8, 4)
    master = torch.zeros(8, 4)
    mark_host((master,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.state[model.weight]["master"] = master
    tracker = TensorTracker()
    tracker.attach(model, optimizer)
    weights = sum(p.nbytes for p in model.parameters())
    assert tracker.live_by_category()["weights"] == tracker.live_bytes == weights
    assert tracker.live_by_category()["optimizer"] == 0
    assert tracker.host_live_by_category()["optimizer"] == tracker.host_live_bytes == 32 * FP32


def test_a_storage_tagged_after_it_was_counted_moves_to_the_host_once():
    model = nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = TensorTracker()
    tracker.attach(model, optimizer)
    with tracker:
        state = torch.zeros(8, 4)  # counted on the device, as a temporary
    optimizer.state[model.weight]["buffer"] = state
    assert tracker.live_bytes == sum(p.nbytes for p in model.parameters()) + state.nbytes
    mark_host((state,))
    tracker.scan()
    # Never in both: the device no longer counts it, the host pool does, as state.
    assert tracker.live_bytes == sum(p.nbytes for p in model.parameters())
    assert tracker.host_live_by_category()["optimizer"] == tracker.host_live_bytes == state.nbytes
    optimizer.state.clear()
    del state
    assert tracker.host_live_bytes == 0
