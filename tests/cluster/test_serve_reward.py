"""``rollart serve-reward CONFIG``: a task's reward as a Ray Serve app on 127.0.0.1 that
starts with no replica, scales up on the first call and logs it (real Ray, a subprocess)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rollart_sdk.cli.serve_reward import deployments
from rollart_sdk.config import load_config
from rollart_sdk.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_deployments_take_each_task_reward_or_its_own_deploy_section():
    from argparse import Namespace

    args = Namespace(host="127.0.0.1", port=8123, min_replicas=0, max_replicas=2,
                     downscale_to_zero_delay_s=10.0)
    cfg, _ = load_config(QUICKSTART)
    plans = deployments(cfg, None, args)
    assert [p.backend.name for p in plans.values()] == [t.reward.name for t in cfg.tasks]
    assert plans["FrozenLake"].app_name == "reward-FrozenLake"
    assert plans["FrozenLake"].url() == "http://127.0.0.1:8123/reward-FrozenLake"
    with pytest.raises(ConfigError, match="no task Nope"):
        deployments(cfg, ["Nope"], args)
    cfg, _ = load_config(QUICKSTART, ["tasks.0.reward.name=serverless",
                                      "tasks.0.reward.options={url: 'http://127.0.0.1:9/'}"])
    with pytest.raises(ConfigError, match="nothing to serve"):
        deployments(cfg, ["FrozenLake"], args)


def _post(url: str, payload: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps({"args": [payload]}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def test_serve_reward_scales_from_zero_and_logs_it(tmp_path):
    port = _free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "COLUMNS": "200"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollart_sdk.cli", "serve-reward", str(QUICKSTART),
             "--task", "FrozenLake", "--insecure", "--port", str(port),
             "--downscale-to-zero-delay-s", "2", "--duration", "240"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
            # SIGINT stops it below; a CI runner's background job would inherit it ignored
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 200
        while "run it with" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/reward-FrozenLake"
        request = {"trajectory_id": "t", "tag": "FrozenLake", "prompt": "", "responses": [],
                   "env_return": 1.0, "terminated": True, "info": {"success": True}}
        answer = _post(url, request)["result"]
        assert answer["reward"] == 1.0 and answer["details"]["replica"]["calls"] >= 1
        while "replicas: 1 -> 0" not in log.read_text():  # idle: back to zero
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    text = log.read_text()
    assert "replicas: 0 -> 1" in text, text
