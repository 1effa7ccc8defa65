"""Reward ``serverless`` with ``deploy:``: a real Ray Serve application on 127.0.0.1 that
scales from zero, checks the bearer token and takes JSON only."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from rollart_reward_serverless.reward import ServerlessReward

from rollart_sdk.serverless.deploy import DeployOptions, ReplicaMonitor, replica_count
from rollart_sdk.testing.reward import make_request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.25)


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def ray_local():
    import ray
    from ray import serve

    from rollart_sdk.ray_utils import init_ray

    init_ray(num_cpus=4, log_to_driver=False)
    yield
    serve.shutdown()
    ray.shutdown()


def test_deploy_scales_from_zero_serves_with_auth_and_back_to_zero(ray_local, monkeypatch,
                                                                   tmp_path):
    import psutil

    from rollart_sdk.serverless.replica_log import read_usage

    monkeypatch.setenv("RS_TEST_TOKEN", "t0k-secret")
    opts = DeployOptions(backend={"name": "rule", "options": {"mode": "success"}},
                         port=_free_port(), downscale_delay_s=0.5, downscale_to_zero_delay_s=2,
                         replica_log=str(tmp_path / "replicas"))
    app = opts.app_name
    events: list[str] = []
    backend = ServerlessReward(deploy=opts.model_dump(), token_env="RS_TEST_TOKEN",
                               timeout_s=120, retries=0)
    assert backend.url == f"http://127.0.0.1:{opts.port}/{app}"
    monitor = ReplicaMonitor(app, emit=events.append, interval_s=0.25).start()
    try:
        assert replica_count(app) == 0  # min_replicas 0: nothing runs before a request
        result = asyncio.run(backend.score(make_request(info={"success": True})))
        assert result.reward == 1.0 and result.details["replica"]["calls"] >= 1
        assert replica_count(app) >= 1

        body = json.dumps({"args": [{"trajectory_id": "x", "tag": "t", "prompt": "",
                                     "responses": [], "env_return": 0.0, "terminated": True,
                                     "info": {"success": True}}]}).encode()
        ok = {"Content-Type": "application/json", "Authorization": "Bearer t0k-secret"}
        assert _post(backend.url, body, ok) == 200
        assert _post(backend.url, body, {"Content-Type": "application/json"}) == 401
        assert _post(backend.url, b"\x80\x03pickle", {**ok, "Content-Type":
                                                      "application/octet-stream"}) == 415

        listening = [c.laddr.ip for c in psutil.net_connections("tcp")
                     if c.laddr and c.laddr.port == opts.port and c.status == "LISTEN"]
        assert listening and set(listening) == {"127.0.0.1"}

        _wait(lambda: len(monitor.history) >= 3 and monitor.history[-1][1] == 0, 120,
              "the monitor to log the scale-down to zero")
    finally:
        monitor.stop()
    counts = [n for _, n in monitor.history]
    assert counts[0] == 0 and max(counts) >= 1 and counts[-1] == 0, events
    assert any("-> 0" in e for e in events[1:]), events
    # Each replica's own log: created -> ready -> busy while scoring -> closed when Serve
    # stopped it at the scale-down; the two scored calls (not the refused ones) are in it.
    _wait(lambda: all(u.closed for u in read_usage(tmp_path / "replicas")), 30,
          "every replica to log 'closed'")
    usage = read_usage(tmp_path / "replicas")
    assert len(usage) >= 1 and sum(u.calls for u in usage) == 2
    assert all(u.ready is not None and 0 < u.busy_s <= u.reserved_s for u in usage
               if u.calls)
