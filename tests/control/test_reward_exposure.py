"""rollart_sdk.control.metrics.reward_exposure: the time a step waited on rewards only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rollart_sdk.control.metrics import reward_exposure


def _traj(rollout_end: float, reward_end: float | None, reward: float = 1.0):
    timings = [("generate", rollout_end - 1.0, rollout_end - 0.5), ("env", rollout_end - 0.5,
                                                                    rollout_end)]
    if reward_end is not None:
        timings.append(("reward", rollout_end, reward_end))
    return SimpleNamespace(timings=timings, reward=reward)


def _rec(step, formed_at, wait_s, batch):
    return SimpleNamespace(step=step, formed_at=formed_at, get_batch_wait_s=wait_s, batch=batch)


def test_exposed_is_from_the_later_of_asked_and_last_rollout_to_the_last_reward():
    records = [
        # asked at 10 - 8 = 2; last rollout ends at 9; last reward at 10: 1 s exposed
        _rec(0, 10.0, 8.0, [_traj(5.0, 6.0), _traj(9.0, 10.0)]),
        # asked at 20 - 1 = 19, after the last rollout (15): rewards from 19 to 20 exposed
        _rec(1, 20.0, 1.0, [_traj(12.0, 13.0), _traj(15.0, 20.0, reward=0.0)]),
        # every reward was in before the trainer asked: nothing exposed
        _rec(2, 30.0, 0.0, [_traj(22.0, 23.0), _traj(24.0, 25.0)]),
    ]
    out = reward_exposure(records, run_started=0.0)
    assert [s["exposed_reward_s"] for s in out["steps"]] == pytest.approx([1.0, 1.0, 0.0])
    assert [s["step_s"] for s in out["steps"]] == pytest.approx([10.0, 10.0, 10.0])
    assert sorted(out["reward_latencies_s"]) == pytest.approx([1, 1, 1, 1, 1, 5])
    assert out["rewards"] == pytest.approx([1.0, 0.5, 1.0])


def test_a_batch_without_reward_spans_exposes_nothing():
    out = reward_exposure([_rec(0, 5.0, 5.0, [_traj(4.0, None)])], run_started=1.0)
    assert out["steps"][0]["exposed_reward_s"] == 0.0 and out["steps"][0]["step_s"] == 4.0


def test_freed_batches_are_an_error_not_zero_exposure():
    records = [_rec(0, 10.0, 8.0, []), _rec(1, 20.0, 1.0, [_traj(15.0, 20.0)])]
    with pytest.raises(ValueError, match=r"steps \[0\].*KEEP_BATCHES"):
        reward_exposure(records, run_started=0.0)
