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
