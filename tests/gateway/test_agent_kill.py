"""`kill -9` of a `rollart train` whose agents run in env processes (env_host: worker): the
agents' requests fail with the gateway gone, and each env process ends quietly. Before,
each one printed its agent's connection error and a BrokenPipeError as a traceback
("Process env-host: ...") on the user's terminal, seven of them in one try."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "--ppid", str(pid), "-o", "pid="], capture_output=True,
                         text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")  # a zombie is gone


def test_killing_the_driver_ends_its_agent_env_processes_quietly(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollart_sdk.cli", "train", "examples/agent_calc.yaml",
             "--steps", "100000", "--no-progress", f"output_dir={tmp_path}",
             "tasks[0].env_host=worker"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONSAFEPATH": "1"})
    try:
        deadline = time.monotonic() + 180
        while "step 3/" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        envs = _children(proc.pid)
        assert envs, "no env process"
        before = len(log.read_text())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in envs) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in envs), "env processes outlived their driver"
        after = log.read_text()[before:]
        assert "Traceback" not in after and "Process env-host" not in after, after[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
