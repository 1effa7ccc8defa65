"""The watchdog's stall clock: it starts when the run starts (``restart``), and until the
first progress the limit is the first episode's budget from the tasks' timeouts."""

from __future__ import annotations

import pytest
from control_configs import two_tasks

from rollart_sdk.config import load_config
from rollart_sdk.control.pipeline import first_episode_s
from rollart_sdk.control.watchdog import RunFailure, Watchdog


def test_the_first_episode_gets_its_budget_then_the_stall_timeout_applies():
    now = [0.0]
    w = Watchdog(["A"], window=4, max_drop_rate=0.9, stall_timeout_s=10,
                 clock=lambda: now[0], first_progress_s=100)
    now[0] = 1000.0  # the pipeline was built long before the run started
    w.restart()
    now[0] += 99
    w.check_stall()
    assert w.failure is None  # a long first episode is not a stall
    w.progress()
    now[0] += 11
    w.check_stall()
    assert isinstance(w.failure, RunFailure)
    assert "no progress for 11s (rollout.stall_timeout_s 10)" in str(w.failure)
    # After a restore the budget applies again; past it, the message says which limit.
    w = Watchdog(["A"], 4, 0.9, 10, clock=lambda: now[0], first_progress_s=100)
    w.progress()
    w.restart()
    now[0] += 101
    w.check_stall()
    assert "the first episode's budget 100s from the tasks' timeouts" in str(w.failure)


def test_the_first_episode_budget_comes_from_the_tasks_timeouts():
    cfg, _ = load_config(data=two_tasks(), overrides=[
        "tasks.0.max_turns=3", "tasks.0.reset_timeout_s=60", "tasks.0.step_timeout_s=20",
        "tasks.0.generate_timeout_s=100", "tasks.0.reward_timeout_s=40"])
    # FrozenLake: 60 + 3 * (100 + 20) + 40 = 460; Arithmetic: 30 + 1 * (300 + 30) + 300 = 660
    assert first_episode_s(cfg) == pytest.approx(660)
    cfg, _ = load_config(data=two_tasks(), overrides=["tasks.0.max_turns=10"])
    assert first_episode_s(cfg) == pytest.approx(30 + 10 * 330 + 300)
