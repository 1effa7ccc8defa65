"""What a SIGKILLed driver's local Ray leaves behind is stopped by the next local start
(``rollart_sdk.ray_leftovers``): on a real process tree, and on a real local Ray whose
driver is SIGKILLed (its ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` would
otherwise live on for about a minute, holding the dashboard agent's port)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollart_sdk import ray_leftovers

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
              pytest.mark.timeout(300)]

# A driver that starts two children (they outlive it when it is SIGKILLed: they are
# reparented, as Ray's agents are), records its tree, says so and sleeps.
DRIVER = """
import subprocess, sys, time
from rollart_sdk import ray_leftovers
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        for _ in range(2)]
print(ray_leftovers.record(), *[k.pid for k in kids], flush=True)
time.sleep(120)
"""


def _gone(pids: list[int], within: float = 30) -> bool:
    """True once no process of ``pids`` is alive (a hang guard, not a timing check)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(ray_leftovers.start_time(p) is None for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def records(tmp_path, monkeypatch):
    monkeypatch.setenv(ray_leftovers.RECORDS_ENV, str(tmp_path / "records"))
    return tmp_path / "records"


def _kill(pids):
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_processes_of_a_killed_driver_are_stopped_and_a_live_drivers_kept(records):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ))
    path, *kids = driver.stdout.readline().split()
    kids = [int(k) for k in kids]
    try:
        rec = json.loads(Path(path).read_text())
        assert rec["driver"][0] == driver.pid and {p for p, _, _ in rec["processes"]} >= set(kids)
        # The driver is alive: its processes are its own business.
        assert ray_leftovers.stop_leftovers() == [] and Path(path).exists()
        assert all(ray_leftovers.start_time(k) is not None for k in kids)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        assert all(ray_leftovers.start_time(k) is not None for k in kids)  # they live on
        stopped = ray_leftovers.stop_leftovers()
        assert sorted(int(s.split()[0]) for s in stopped) == sorted(kids)
        assert _gone(kids) and not Path(path).exists()
    finally:
        _kill([driver.pid, *kids])


def test_a_reused_pid_is_never_stopped(records):
    """A record names a process by PID and start time: a PID now used by another process
    (here this test's own, with another start time) is left alone."""
    me = os.getpid()
    records.mkdir(parents=True)
    (records / "driver-1-1.json").write_text(json.dumps(
        {"driver": [999_999_999, 1], "processes": [[me, ray_leftovers.start_time(me) + 1, "x"]]}))
    (records / "driver-2-2.json").write_text("{torn")
    assert ray_leftovers.stop_leftovers() == []
    assert list(records.iterdir()) == []  # both records are done with


RAY_DRIVER = """
import time
from rollart_sdk.ray_utils import init_ray
init_ray(num_cpus=1)
print("up", flush=True)
time.sleep(300)
"""


@pytest.mark.slow
def test_a_killed_drivers_ray_agents_are_stopped_by_the_next_start(records):
    """Real Ray: SIGKILL a driver that started a local Ray; its agents are still alive
    (they would be for about a minute); the next start's clean-up stops them."""
    driver = subprocess.Popen([sys.executable, "-c", RAY_DRIVER], stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ), start_new_session=True)
    procs: list[int] = []
    try:
        assert driver.stdout.readline().strip() == "up"
        (path,) = records.glob("driver-*.json")
        rec = json.loads(path.read_text())
        procs = [p for p, _, _ in rec["processes"]]
        titles = " ".join(t for _, _, t in rec["processes"])
        assert "raylet" in titles and "gcs_server" in titles, titles
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        stopped = ray_leftovers.stop_leftovers()
        names = " ".join(stopped)
        assert "ray::DashboardAgent" in names or "ray::RuntimeEnvAgent" in names, (stopped, titles)
        assert _gone(procs), [p for p in procs if ray_leftovers.start_time(p) is not None]
    finally:
        _kill([driver.pid, *procs])
