"""`rollart train` stopped mid-run by a signal sent to its whole process group (a terminal's
Ctrl-C, ``kill -- -PGID``, ``timeout``, a process supervisor): it exits within seconds with
the documented code, a final checkpoint that loads and ``summary.json``, and nothing from
Ray's own teardown on the console (the GCS once died with the driver's group and the driver
then waited 60 s: "Failed to connect to GCS within 60 seconds ... The program will
terminate.").

The 10 s bound is a hang guard (the subprocess's timeout), not a speed figure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from control_configs import two_tasks

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(1500)  # each case waits for a first step (minutes at load 25)
# From the signal to the exit: a hang guard, not a speed figure. The stop takes about 4 s
# on an idle machine (issue 31 asks for under 10 s); the fault this guards against took
# 60 s and more (Ray waiting for a GCS the signal had killed). 45 s leaves room for the
# parallel test processes of CI on 2 cores.
STOP_GUARD_S = 45
START_GUARD_S = 600  # from the command to the first step (a loaded 2-core CI machine)

# One task, one engine, the embedded tiny model; far more steps than any test waits for.
CONFIG = two_tasks(
    name="stop",
    roles={"actor_gen": {"workers": 1}},
    tasks=[two_tasks()["tasks"][0]],
    transport={"name": "ray"},
    rollout={"batch_size": 8, "group_size": 4, "mode": "async", "alpha": 1},
    train={"steps": 500, "bucket_mb": 1, "save_final_model": False},
)
# What Ray's teardown, or a stop that leaves calls behind, prints when it goes wrong.
TEARDOWN_NOISE = ("Failed to connect to GCS", "The program will terminate", "Traceback",
                  "exception was never retrieved", "Task was destroyed but it is pending")


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    return env


def _restore_sigint() -> None:
    # A background job of a non-interactive shell starts with SIGINT ignored, and a Python
    # started so keeps ignoring it: the child gets the default, as in a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(tmp_path: Path, layout: str) -> tuple[subprocess.Popen[str], Path, Path]:
    cfg = tmp_path / "stop.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "layout": layout}))
    out = tmp_path / "runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollart_sdk.cli", "train", str(cfg), "--no-progress",
         f"output_dir={out}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT,
        start_new_session=True, preexec_fn=_restore_sigint)
    return proc, cfg, out


def _wait_first_step(proc: subprocess.Popen[str], out: Path) -> Path:
    deadline = time.monotonic() + START_GUARD_S
    while time.monotonic() < deadline and proc.poll() is None:
        done = [p.parent for p in out.glob("*/metrics.jsonl") if p.read_text().strip()]
        if done:
            return done[0]
        time.sleep(0.5)
    proc.kill()
    stdout, stderr = proc.communicate(timeout=60)
    raise AssertionError(f"no step trained (exit {proc.returncode}):\n{stdout[-2000:]}\n"
                         f"{stderr[-3000:]}")


def _stop(proc: subprocess.Popen[str], sig: signal.Signals) -> tuple[str, str]:
    os.killpg(proc.pid, sig)  # the whole group, as a terminal or a supervisor sends it
    try:
        return proc.communicate(timeout=STOP_GUARD_S)
    except subprocess.TimeoutExpired:
        # Where it waits: the CLI prints every thread's and every asyncio task's stack on
        # SIGUSR1 (rollart_sdk.cli.dump_stacks_on_sigusr1); then it is killed.
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=60)
        raise AssertionError(f"still running {STOP_GUARD_S} s after {sig.name}:\n"
                             f"{stdout[-2000:]}\n{stderr[-12000:]}") from None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups, Linux")
@pytest.mark.parametrize(("layout", "sig", "code"), [
    ("ray", signal.SIGTERM, 143),
    ("ray", signal.SIGINT, 130),
    ("inprocess", signal.SIGTERM, 143),
])
def test_a_signal_to_the_group_stops_rollart_train_in_seconds(tmp_path, layout, sig, code):
    proc, cfg, out = _start(tmp_path, layout)
    try:
        run_dir = _wait_first_step(proc, out)
        stdout, stderr = _stop(proc, sig)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
    assert proc.returncode == code, stdout[-2000:] + stderr[-3000:]
    for noise in TEARDOWN_NOISE:
        assert noise not in stdout + stderr, stderr[-3000:]
    assert f"layout: {layout}" in stdout
    assert f"interrupted ({sig.name}); newest checkpoint:" in stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] and summary["signal"] == sig.name
    assert summary["layout"]["layout"] == layout
    assert summary["checkpoint_errors"] == []
    assert summary["launched"] == summary["trained"] + sum(summary["dropped"].values())
    newest = Path(summary["newest_checkpoint"])
    assert newest.name == f"step-{summary['steps']}" and summary["steps"] >= 1
    if layout == "ray" and sig == signal.SIGTERM:
        _resume_one_step(cfg, run_dir, summary["steps"])


def _resume_one_step(cfg: Path, run_dir: Path, steps: int) -> None:
    """The final checkpoint loads: the run goes on from it for one step, in the other
    layout (a checkpoint does not depend on where the workers ran)."""
    res = subprocess.run(
        [sys.executable, "-m", "rollart_sdk.cli", "train", str(cfg), "--no-progress",
         f"output_dir={run_dir.parent}", "layout=inprocess", "--steps", str(steps + 1),
         "--resume", str(run_dir)],
        capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=START_GUARD_S)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert f"resumed from {run_dir / 'checkpoints' / f'step-{steps}'}" in res.stdout + res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps + 1 and summary["layout"]["layout"] == "inprocess"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGUSR1, Linux")
def test_sigusr1_prints_where_every_thread_is_and_the_run_goes_on(tmp_path):
    """``kill -USR1 PID``: the driver prints each thread's Python stack and each asyncio
    task's to stderr (where a run that seems stuck waits) and keeps training; a SIGTERM
    then stops it as usual."""
    proc, _, out = _start(tmp_path, "inprocess")
    try:
        run_dir = _wait_first_step(proc, out)
        os.kill(proc.pid, signal.SIGUSR1)
        metrics = run_dir / "metrics.jsonl"
        steps_then = len(metrics.read_text().splitlines())
        deadline = time.monotonic() + START_GUARD_S
        while (len(metrics.read_text().splitlines()) <= steps_then
               and time.monotonic() < deadline and proc.poll() is None):
            time.sleep(0.5)
        assert proc.poll() is None  # still running after the dump ...
        assert len(metrics.read_text().splitlines()) > steps_then  # ... and training
        stdout, stderr = _stop(proc, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
    assert proc.returncode == 143, stdout[-2000:] + stderr[-3000:]
    assert "Current thread" in stderr and "(most recent call first)" in stderr, stderr[-3000:]
    assert "rollart_sdk/cli/train.py" in stderr, stderr[-3000:]  # the main thread's stack
    # ... and each asyncio task's: the run's main coroutine waits in the pipeline.
    assert "asyncio: " in stderr and "rollart_sdk/control/pipeline.py" in stderr, stderr[-3000:]
