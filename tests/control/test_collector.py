"""The driver's collector settings during a run are undone after it (and a user's
disabled collector stays disabled)."""

from __future__ import annotations

import gc

import pytest

from rollart_sdk.control.collector import (
    YOUNG_CAP,
    YOUNG_PER_TRAJECTORY,
    YOUNG_THRESHOLD,
    driver_collector,
)


def test_the_run_freezes_and_raises_the_young_threshold_then_restores_both() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    marker = [object()]  # exists before the run: moved to the permanent generation
    with driver_collector():
        assert gc.get_threshold()[0] == max(before[0], YOUNG_THRESHOLD)
        assert gc.get_threshold()[1:] == before[1:]
        assert gc.get_freeze_count() > frozen
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    assert marker


def test_a_disabled_collector_stays_disabled() -> None:
    before = gc.get_threshold()
    gc.disable()
    try:
        with driver_collector():
            assert not gc.isenabled()
            assert gc.get_threshold() == before
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_an_error_in_the_run_still_restores_the_collector() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError, match="the run failed"), driver_collector():
        raise RuntimeError("the run failed")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_the_young_threshold_follows_the_trajectories_in_flight() -> None:
    before = gc.get_threshold()
    with driver_collector() as c:
        floor = gc.get_threshold()[0]
        assert c.fit(10) == floor  # few in flight: the floor stays
        assert gc.get_threshold()[0] == floor
        assert c.fit(2048) == YOUNG_PER_TRAJECTORY * 2048 > floor
        assert gc.get_threshold() == (YOUNG_PER_TRAJECTORY * 2048, *before[1:])
        assert c.fit(10**9) == YOUNG_CAP  # bounded
        c.fit(0)
        assert gc.get_threshold()[0] == floor  # back down when the run shrinks
    assert gc.get_threshold() == before


def test_fit_keeps_a_disabled_collector_as_it_was() -> None:
    before = gc.get_threshold()
    gc.disable()
    try:
        with driver_collector() as c:
            c.fit(4096)
            assert gc.get_threshold() == before and not gc.isenabled()
    finally:
        gc.enable()
