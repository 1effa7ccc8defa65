"""The console warning for a trained policy that is not the sampled one
(`control/diagnostics.py::MismatchWatch`, called on every step's metrics)."""

from __future__ import annotations

from rollart_sdk.control.diagnostics import MISMATCH_WARN, MismatchWatch


def test_rounding_is_not_warned_about_a_different_distribution_is_once():
    w = MismatchWatch()
    # fp32 kernels (2e-6) and a bf16 SmolLM2 run's worst step (0.044): no warning.
    assert w.check({"step": 1, "train/mismatch_mean": 2e-6, "train/mismatch_max": 2e-5}) == []
    assert w.check({"step": 2, "train/mismatch_mean": 0.044, "train/mismatch_max": 0.45}) == []
    assert w.check({"step": 3, "train/mismatch_mean": float("nan")}) == []  # no fresh token
    (line,) = w.check({"step": 4, "train/mismatch_mean": 0.31, "train/mismatch_max": 4.2})
    assert line.startswith("at step 4 the trainer's log-probs differ from the engines' by "
                           "0.31 nats per token on average, at most 4.2")
    assert "the trained policy is not the sampled one" in line
    assert w.check({"step": 5, "train/mismatch_mean": 0.5}) == []  # said once


def test_with_several_engines_the_one_that_differs_is_named():
    w = MismatchWatch()
    lines = w.check({"step": 7, "train/mismatch_mean": 0.06,
                     "train/mismatch_mean/gen-0": 1e-6, "train/mismatch_mean/gen-1": 0.12,
                     "train/mismatch_max/gen-1": 2.0})
    assert len(lines) == 1 and "from engine gen-1's by 0.12" in lines[0], lines
    assert "train/mismatch_mean/gen-1 in metrics.jsonl" in lines[0]
    assert w.check({"step": 8, "train/mismatch_mean/gen-0": MISMATCH_WARN}) != []
