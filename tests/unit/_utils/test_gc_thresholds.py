"""The `memfit` command's garbage-collection thresholds, and a program's own kept."""

from __future__ import annotations

import gc

import pytest

from memfit._utils.gc_thresholds import CPYTHON_DEFAULTS, THRESHOLDS, collect_less_often


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_the_defaults_are_raised(thresholds):
    gc.set_threshold(*CPYTHON_DEFAULTS)
    collect_less_often()
    assert gc.get_threshold() == THRESHOLDS


def test_thresholds_a_program_chose_are_kept(thresholds):
    gc.set_threshold(2_000, 5, 5)
    collect_less_often()
    assert gc.get_threshold() == (2_000, 5, 5)
