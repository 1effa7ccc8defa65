"""lr_factor on hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from rollart_sdk.backends.schedules import lr_factor


def test_constant_with_warmup():
    assert [lr_factor(s, "constant", warmup_steps=4) for s in range(6)] == [
        0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_factor(10**6) == 1.0


def test_linear_decays_to_min_ratio_at_decay_steps_and_stays():
    f = [lr_factor(s, "linear", decay_steps=4) for s in range(7)]
    assert f == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0, 0.0]
    g = [lr_factor(s, "linear", warmup_steps=2, decay_steps=6, min_ratio=0.2) for s in range(8)]
    assert g == pytest.approx([0.5, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2])


def test_cosine_half_way_is_half():
    assert lr_factor(0, "cosine", decay_steps=10) == 1.0
    assert lr_factor(5, "cosine", decay_steps=10) == pytest.approx(0.5)
    assert lr_factor(2, "cosine", decay_steps=10) == pytest.approx(0.5 * (1 + math.cos(0.2 * math.pi)))
    assert lr_factor(10, "cosine", decay_steps=10, min_ratio=0.1) == pytest.approx(0.1)


def test_bad_schedules_are_named():
    with pytest.raises(ValueError, match="unknown lr schedule 'step'"):
        lr_factor(0, "step")
    with pytest.raises(ValueError, match="needs decay_steps > warmup_steps"):
        lr_factor(3, "linear", warmup_steps=2, decay_steps=None)
