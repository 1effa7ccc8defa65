"""The sim reward's serverless cold/warm model, env failures in a simulated job (dropped
with the reason, retried, never a hang). The paper experiments' rows: the benchmark
suite's tests/test_paper.py."""

from __future__ import annotations

import json

import pytest

from rollart_sdk.config import load_config
from rollart_sdk.sim import workloads as W
from rollart_sdk.sim.backends import SimReward
from rollart_sdk.sim.job import build_sim_job, run_sim


def test_serverless_reward_is_cold_first_warm_after_and_cold_again_when_scaled_to_zero():
    r = SimReward(warm_s=W.dist(mean=0.1), cold_s=W.dist(mean=2.0), keep_warm_s=10.0)
    assert r.acquire(0.0) == pytest.approx(2.1)  # no instance: cold start
    r.release(2.1)
    assert r.acquire(5.0) == pytest.approx(0.1)  # the idle one is warm
    assert r.acquire(5.0) == pytest.approx(2.1)  # a concurrent second call: another cold one
    r.release(5.1)
    r.release(7.1)
    assert r.acquire(8.0) == pytest.approx(0.1) and r.acquire(8.0) == pytest.approx(0.1)
    r.release(8.1)
    r.release(8.1)
    assert r.acquire(30.0) == pytest.approx(2.1)  # idle past keep_warm_s: scaled to zero
    assert r.cold_starts == 3 and r.calls == 6


def test_env_failures_are_dropped_with_the_reason_and_retried(tmp_path):
    task = W.frozenlake(step_mu=1.0, step_sigma=0.0, turns=3, response=W.dist(mean=50))
    task["env"]["options"]["step_failure"] = 0.1
    data = W.base([task], {"H800": (2, 1)}, mode="async", batch=16, group=4)
    data["output_dir"] = str(tmp_path)
    cfg, _ = load_config(data=data)
    job = build_sim_job(cfg, log=lambda *a: None)
    run_sim(job, 4)
    summary = json.loads((job.run_dir.path / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["trained"] == 64
    assert any(k.startswith("env_step_failed") for k in summary["dropped"]), summary["dropped"]
    assert summary["retried"] > 0
    assert (job.run_dir.path / "drops.jsonl").read_text().count("env_step_failed") > 0
