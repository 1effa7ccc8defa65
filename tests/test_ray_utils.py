"""Finding Ray worker processes by actor class (``rollart_sdk.ray_utils.actor_pids``), the
helper the failure tests and ``rollart bench soak --kill-engine-every`` kill workers with:
on a real process tree whose command lines read like Ray's worker titles."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from rollart_sdk.ray_utils import actor_pids, descendants

# A parent that starts two children titled like Ray workers (the title is built in the
# parent, so its own command line holds the class names but not "ray::NAME") and prints
# their PIDs; every process sleeps until it is killed (at most 60 s).
PARENT = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                          "ray::" + name + sfx]) for name, sfx in
        ((sys.argv[1], ".generate()"), (sys.argv[2], ""))]
print(*[k.pid for k in kids], flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_actor_pids_finds_the_workers_of_one_class_below_a_process() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, "EngineWorker", "TrainerWorker"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        engine, trainer = (int(p) for p in parent.stdout.readline().split())
        below = descendants(parent.pid)
        assert set(below) == {engine, trainer}
        assert below[engine].endswith("ray::EngineWorker.generate()")
        assert actor_pids("EngineWorker", parent.pid) == [engine]  # busy title: .method()
        assert actor_pids("TrainerWorker", parent.pid) == [trainer]  # idle title
        # default root: this process, through the parent; the parent's command line names
        # the classes without "ray::", so it is not taken for a worker
        assert actor_pids("EngineWorker") == [engine]
        assert os.getpid() not in descendants(os.getpid())
    finally:
        for pid in descendants(parent.pid):  # before the parent: orphans are not below it
            os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait(10)


def test_a_local_ray_keeps_a_users_worker_niceness(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollart_sdk.ray_utils import NICENESS_ENV, workers_at_driver_niceness

    monkeypatch.delenv(NICENESS_ENV, raising=False)
    with workers_at_driver_niceness():
        assert os.environ[NICENESS_ENV] == "0"  # what the raylet reads when it starts
    assert NICENESS_ENV not in os.environ  # only while Ray starts
    monkeypatch.setenv(NICENESS_ENV, "5")
    with workers_at_driver_niceness():
        assert os.environ[NICENESS_ENV] == "5"


# A driver that starts the SDK's local Ray and prints its own niceness and an actor's.
NICENESS_DRIVER = """
import os, ray
from rollart_sdk.ray_utils import init_ray
init_ray(num_cpus=1, log_to_driver=False)
@ray.remote(num_cpus=0)
class A:
    def nice(self):
        return os.nice(0)
print(os.nice(0), ray.get(A.remote().nice.remote(), timeout=120), flush=True)
ray.shutdown()
"""


@pytest.mark.timeout(300)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Ray's niceness: Linux")
def test_the_sdks_local_ray_runs_its_workers_at_the_drivers_niceness() -> None:
    """Ray's default puts every worker 15 above the driver (capped at 19): the trainer and
    engines of a Ray-layout run would yield the CPU to anything else on the machine."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    out = subprocess.run([sys.executable, "-c", NICENESS_DRIVER], env=env, timeout=280,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    driver, actor = (int(x) for x in out.stdout.split()[-2:])
    assert actor == driver
