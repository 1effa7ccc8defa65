"""The sim reward's serverless cold/warm model, env failures in a simulated job (dropped
with the reason, retried, never a hang), and the experiment's JSON rows."""

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


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_straggler_experiment_writes_rows_per_sigma(tmp_path):
    from rollart_sdk.sim.experiments import run_experiment

    out = tmp_path / "s.json"
    lines: list[str] = []
    assert run_experiment("straggler", json_path=str(out), quick=True, out=lines.append) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["sigma_over_mu"] for r in rows] == [0.0, 0.1, 0.5, 1.0]
    speedups = [r["speedup"] for r in rows]
    assert speedups[0] == pytest.approx(1.0, abs=0.01)
    assert speedups == sorted(speedups) and speedups[-1] > 1.3
    assert any("paper" in line for line in lines)
