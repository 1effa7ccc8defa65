"""Reward ``serverless`` against real HTTP endpoints on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from rollart_reward_serverless.reward import ServerlessReward, ServerlessRewardOptions
from rollart_reward_serverless.serve import serve_reward

from rollart_sdk.serverless import ServerlessError, serve_function
from rollart_sdk.testing.reward import check_reward, make_request


def test_scores_through_a_served_rule_reward():
    with serve_reward("rule", {"mode": "success"}) as endpoint:
        backend = ServerlessReward(endpoint.url, timeout_s=10)
        results = check_reward(backend, [
            (make_request(info={"success": True}, trajectory_id="a"), 1.0),
            (make_request(info={"success": False}, trajectory_id="b"), 0.0),
        ])
        assert results[0].details["endpoint"] == endpoint.url
        assert endpoint.calls >= 2  # really went over HTTP


def test_retries_a_failing_call_then_succeeds():
    calls = []

    def flaky(request):
        calls.append(request["trajectory_id"])
        if len(calls) == 1:
            raise RuntimeError("cold start")
        return {"reward": 0.5, "details": {"seen": request["responses"]}}

    with serve_function(flaky) as endpoint:
        backend = ServerlessReward(endpoint.url, timeout_s=10, retries=2, backoff_s=0.01)
        result = asyncio.run(backend.score(make_request(responses=["x"], trajectory_id="t")))
    assert result.reward == 0.5 and result.details["attempts"] == 2
    assert result.details["seen"] == ["x"] and calls == ["t", "t"]


def test_dead_endpoint_fails_clearly_within_bounded_time():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    backend = ServerlessReward(f"http://127.0.0.1:{port}/", timeout_s=2, retries=1, backoff_s=0.01)
    t0 = time.monotonic()
    with pytest.raises(ServerlessError, match=f"127.0.0.1:{port}.*failed 2 time"):
        asyncio.run(backend.score(make_request()))
    assert time.monotonic() - t0 < 30


def test_malformed_answer_is_rejected():
    with serve_function(lambda request: {"score": 1}) as endpoint:
        backend = ServerlessReward(endpoint.url, retries=0)
        with pytest.raises(ServerlessError, match="must answer"):
            asyncio.run(backend.score(make_request()))


def test_unknown_scheme_is_a_config_error():
    with pytest.raises(ValueError, match="no serverless transport for scheme 'ftp'"):
        ServerlessRewardOptions(url="ftp://example/x")


def _run_config(url: str, out: str, **reward_options) -> dict:
    return {
        "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                           "intermediate_size": 64}},
        "tasks": [{"tag": "FrozenLake",
                   "env": {"name": "frozenlake",
                           "options": {"desc": ["SFF", "FHF", "FFG"], "obs_format": "compact"}},
                   "reward": {"name": "serverless", "options": {"url": url, **reward_options}},
                   "max_turns": 4, "constrain_actions": True, "system_prompt": None}],
        "engine": {"name": "torch"},
        "trainer": {"name": "torch", "options": {"lr": 0.001, "micro_batch_size": 16}},
        "transport": {"name": "local"},
        "rollout": {"batch_size": 8, "group_size": 4},
        "output_dir": out,
    }


def test_pipeline_rewards_through_the_endpoint(tmp_path):
    """The control plane dispatches each finished trajectory to the endpoint (R3)."""
    from rollart_sdk.config import load_config
    from rollart_sdk.job import build_job, run_job

    with serve_reward("rule", {"mode": "success"}) as endpoint:
        cfg, lines = load_config(data=_run_config(endpoint.url, str(tmp_path)))
        job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
        try:
            records = run_job(job, 2, progress=False)
        finally:
            job.close()
        trained = [t for r in records for t in r.batch]
        assert len(trained) == 16
        assert all(t.info["reward_details"]["endpoint"] == endpoint.url for t in trained)
        assert endpoint.calls >= len(trained)


def test_run_completes_through_an_outage_500s_and_slow_answers(tmp_path):
    """Faults never become rewards: failed calls drop their trajectory (counted with the
    reason), the run replaces them and completes; every trained reward came from an answer."""
    import itertools
    import json
    import threading

    from rollart_sdk.config import load_config
    from rollart_sdk.job import build_job, run_job
    from rollart_sdk.serverless import ServerlessEndpoint

    counter = itertools.count()

    def flaky(request):
        n = next(counter)
        if n % 5 == 1:
            raise RuntimeError("backend error")  # HTTP 500
        if n % 7 == 3:
            time.sleep(1.5)  # slower than timeout_s
        return {"reward": 1.0 if request["info"].get("success") else 0.0, "details": {"n": n}}

    box = {"ep": ServerlessEndpoint(flaky)}
    port = box["ep"].server.server_address[1]

    def outage():  # kill the endpoint after some calls, bring it back 2 s later
        while box["ep"].calls < 12:
            time.sleep(0.05)
        box["ep"].close()
        time.sleep(2.0)
        box["ep"] = ServerlessEndpoint(flaky, port=port)

    killer = threading.Thread(target=outage, daemon=True)
    killer.start()
    cfg, lines = load_config(data=_run_config(f"http://127.0.0.1:{port}/", str(tmp_path),
                                              timeout_s=0.5, retries=0, breaker_failures=50))
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    try:
        records = run_job(job, 4, progress=False)
    finally:
        job.close()
        killer.join(timeout=30)
        box["ep"].close()
    assert len(records) == 4
    trained = [t for r in records for t in r.batch]
    assert all("n" in t.info["reward_details"] for t in trained)  # a real answer each
    summary = json.loads((job.run_dir.path / "summary.json").read_text())
    failed = {k: v for k, v in summary["dropped"].items() if k.startswith("reward_failed")}
    assert sum(failed.values()) >= 2, summary["dropped"]
    trained_n = summary.get("trained", summary.get("trajectories_trained"))
    assert summary["launched"] == trained_n + sum(summary["dropped"].values())


def test_a_run_rides_out_an_outage_of_its_reward_endpoint(tmp_path):
    """HTTP 500 on every call for 4 s from the first call: the circuit opens, finished
    trajectories wait for their reward instead of failing at once, so the drop-rate rule
    (a small window here, so that a few dozen failures would trip it) does not stop the
    run, and it completes."""
    import json

    from rollart_sdk.config import load_config
    from rollart_sdk.job import build_job, run_job

    state: dict = {"first": None, "failed": 0}

    def switchable(request):
        now = time.monotonic()
        state["first"] = state["first"] or now
        if now - state["first"] < 4.0:
            state["failed"] += 1
            raise RuntimeError("backend down")  # HTTP 500
        return {"reward": 1.0 if request["info"].get("success") else 0.0, "details": {}}

    with serve_function(switchable) as endpoint:
        data = _run_config(endpoint.url, str(tmp_path), timeout_s=5, breaker_failures=3,
                           breaker_cooldown_s=0.5, outage_wait_s=60)
        data["rollout"].update(drop_window=16, max_drop_rate=0.5)
        cfg, lines = load_config(data=data)
        job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
        try:
            records = run_job(job, 3, progress=False)
        finally:
            job.close()
    assert len(records) == 3 and state["failed"] >= 3
    summary = json.loads((job.run_dir.path / "summary.json").read_text())
    assert summary["error"] is None
    failed = sum(v for k, v in summary["dropped"].items() if k.startswith("reward_failed"))
    assert failed < 8, summary["dropped"]  # the outage cost time, not trajectories


@pytest.mark.timeout(300)
def test_a_run_whose_reward_endpoint_dies_stops_with_the_reason_and_its_checkpoint(tmp_path):
    """Reliability probe 3c at run level: the endpoint goes away for good mid-run (closed:
    what a SIGKILLed server looks like to its clients, connection refused). Finished
    trajectories wait out ``outage_wait_s``, then fail with the endpoint named; the
    drop-rate rule stops the run with that reason, and the run leaves its final
    checkpoint and summary with balanced accounting."""
    import json
    import threading

    from rollart_sdk.config import load_config
    from rollart_sdk.control.watchdog import RunFailure
    from rollart_sdk.job import build_job, run_job

    started: dict = {}

    def reward(request):
        if "timer" not in started:  # the first call: the server dies 3 s later
            started["timer"] = threading.Timer(3.0, endpoint.close)
            started["timer"].start()
        return {"reward": 1.0 if request["info"].get("success") else 0.0, "details": {}}

    endpoint = serve_function(reward)
    try:
        data = _run_config(endpoint.url, str(tmp_path), timeout_s=2, retries=1,
                           breaker_failures=2, breaker_cooldown_s=0.5, outage_wait_s=3)
        data["rollout"].update(drop_window=16, max_drop_rate=0.5)
        cfg, lines = load_config(data=data)
        job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
        try:
            with pytest.raises(RunFailure) as err:
                run_job(job, 200, progress=False)
        finally:
            job.close()
    finally:
        started.get("timer") and started["timer"].cancel()
        endpoint.close()
    assert endpoint.url in str(err.value) and "reward" in str(err.value), str(err.value)
    summary = json.loads((job.run_dir.path / "summary.json").read_text())
    assert summary["error"] and endpoint.url in summary["error"]
    assert summary["launched"] == summary["trained"] + sum(summary["dropped"].values())
    assert any(k.startswith("reward_failed") for k in summary["dropped"]), summary["dropped"]
    if summary["steps"]:  # a step was trained before the endpoint died: it is saved
        ckpts = sorted((job.run_dir.path / "checkpoints").glob("step-*"))
        assert ckpts and ckpts[-1].name == f"step-{summary['steps']}", ckpts
