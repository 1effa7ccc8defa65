"""The console's account of what went wrong in a run (`rollart_sdk/cli/train.py::
fault_lines`): nothing for a clean run; for a run with faults, one line a kind, with the
numbers summary.json holds, also for a run stopped by SIGTERM; and the line a task whose
trajectories keep failing gets when its launches start backing off (the scheduler's). The
engine-death lines are checked on a real Ray run in tests/control/test_failures_ray.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from control_configs import two_tasks

from rollart_sdk.cli.train import fault_lines

ROOT = Path(__file__).resolve().parents[2]

CLEAN = {
    "launched": 40, "trained": 40, "dropped": {}, "checkpoint_errors": [],
    "engine_recovery": {"deaths": {}, "recovered": {}, "failed": {}, "rerouted_requests": 0,
                        "down_at_end": {}, "reformed_rounds": []},
    "env_close_errors": {}, "side_errors": {"count": 0, "examples": []},
    "envs": {"pools": {}, "constructions": {}, "threads": {"env-thread": {
        "hung": 0, "hung_peak": 0, "timed_out": 0, "refused": 0, "closed_late": 0}}},
}


def test_a_clean_run_has_no_fault_line():
    assert fault_lines(CLEAN) == []
    assert fault_lines({}) == []  # an older summary.json without these keys
    # Trajectories still running when the run stopped are the stop, not a fault.
    assert fault_lines({**CLEAN, "dropped": {"run_end": 30, "aborted:run_end": 2}}) == []


def test_each_kind_of_fault_is_one_line_with_its_numbers():
    s = json.loads(json.dumps(CLEAN))
    s["launched"] = 50
    s["dropped"] = {"env_error": 7, "timeout": 3, "run_end": 4, "aborted:run_end": 2}
    s["engine_recovery"].update(deaths={"gen-1": 2, "gen-0": 1}, recovered={"gen-1": 1},
                                failed={"gen-0": "not restarted within 300s"},
                                rerouted_requests=12)
    s["envs"]["threads"]["env-thread"].update(timed_out=4, refused=1)
    s["side_errors"]["count"] = 2
    s["env_close_errors"] = {"FrozenLake": 3}
    s["checkpoint_errors"] = ["checkpoint step-4 failed: OSError: disk full"]
    lines = fault_lines(s)
    assert lines == [
        "engines: gen-0 died 1x, came back 0x; gen-1 died 2x, came back 1x; 12 requests "
        "re-sent (to another engine, or to the same one once back)",
        "engine gen-0 did not come back: not restarted within 300s",
        "dropped: 10 of 50 trajectories (env_error 7, timeout 3); drops.jsonl has each "
        "one's reason",
        "env calls: 4 past their timeout, 1 refused (a host's threads all held by hung calls)",
        "side errors: 2 (examples: summary.json, side_errors)",
        "env closes failed: FrozenLake 3",
        "checkpoint saves failed: 1 (the last: checkpoint step-4 failed: OSError: disk full)",
    ]


# The drops the control plane decides, said on a line of their own.
DECIDED = {"stale", "aborted:stale", "surplus", "aborted:surplus", "group_incomplete:stale",
           "group_incomplete:surplus"}


def test_what_the_control_plane_decided_is_not_a_failure_line():
    """An async run's staleness bound at work (the quickstart: stale 8, aborted:stale 4,
    and the survivors of groups they cut) is said apart from the failures, which keep
    the "dropped:" line; a group cut by a failure stays a failure's."""
    s = {**CLEAN, "launched": 5192, "dropped": {
        "group_incomplete:stale": 28, "stale": 8, "aborted:stale": 4, "env_step_failed": 3,
        "group_incomplete": 2, "zero_variance": 16,
        "aborted:run_end": 5}}
    assert fault_lines(s) == [
        "dropped: 5 of 5192 trajectories (env_step_failed 3, group_incomplete 2); "
        "drops.jsonl has each one's reason",
        "not trained by design: 56 of 5192 (group_incomplete:stale 28, zero_variance 16, "
        "stale 8, aborted:stale 4: the staleness bound, rollout.alpha; the zero-variance "
        "filter)",
    ]
    only = {**CLEAN, "launched": 40, "dropped": {"stale": 2, "aborted:surplus": 1}}
    assert fault_lines(only) == [
        "not trained by design: 3 of 40 (stale 2, aborted:surplus 1: the staleness bound, "
        "rollout.alpha; redundant rollout's surplus)"]


def faulty(name: str, step_error: float, steps: int, **rollout: int) -> dict:
    """One task (FrozenLake) whose env steps raise with probability ``step_error``."""
    task = two_tasks()["tasks"][0]
    task["env"]["faults"] = {"step_error": step_error}  # a step raises: the trajectory drops
    return two_tasks(name=name, roles={"actor_gen": {"workers": 1}}, tasks=[task],
                     rollout={"batch_size": 8, "group_size": 4, "mode": "sync", **rollout},
                     train={"steps": steps, "bucket_mb": 1, "save_final_model": False})


def train_command(tmp_path, config: dict) -> tuple[list[str], dict[str, str]]:
    """``rollart train`` of ``config`` (in process) and its environment."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RAY_ADDRESS", None)
    return ([sys.executable, "-m", "rollart_sdk.cli", "train", str(cfg), "--no-progress",
             f"output_dir={tmp_path / 'runs'}"], env)


@pytest.mark.timeout(600)
def test_a_run_whose_env_fails_says_how_many_trajectories_it_dropped_and_why(tmp_path):
    argv, env = train_command(tmp_path, faulty("faulty", 0.2, steps=2))
    res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=500)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith("faulty")]
    summary = json.loads((run / "summary.json").read_text())
    dropped = summary["dropped"]
    faults = {k: v for k, v in dropped.items() if not k.endswith("run_end") and k not in DECIDED}
    assert sum(faults.values()) > 0, summary  # a fifth of the steps fail: some episode did
    line = next(x for x in res.stdout.splitlines() if x.startswith("dropped: "))
    m = re.match(r"dropped: (\d+) of (\d+) trajectories \((.*)\); drops\.jsonl", line)
    assert m, line
    assert int(m.group(2)) == summary["launched"]
    assert int(m.group(1)) == sum(faults.values())
    assert dict(x.rsplit(" ", 1) for x in m.group(3).split(", ")) == {
        k: str(v) for k, v in faults.items()}
    assert len((run / "drops.jsonl").read_text().splitlines()) == sum(dropped.values())
    assert "engines: " not in res.stdout  # no engine died


@pytest.mark.timeout(600)
def test_a_stopped_run_says_its_faults_before_how_to_resume(tmp_path):
    argv, env = train_command(tmp_path, faulty("faulty", 0.2, steps=500))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # two steps trained and a step failed: SIGTERM
            runs = list((tmp_path / "runs").glob("faulty-*"))
            if (runs and (runs[0] / "metrics.jsonl").exists()
                    and len((runs[0] / "metrics.jsonl").read_text().splitlines()) >= 2
                    and "env_step_failed" in (runs[0] / "drops.jsonl").read_text()):
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out[-3000:]
    lines = out.splitlines()
    dropped = next(i for i, x in enumerate(lines) if x.startswith("dropped: "))
    stopped = next(i for i, x in enumerate(lines) if x.startswith("interrupted (SIGTERM)"))
    assert dropped < stopped, out[-3000:]


@pytest.mark.timeout(600)
def test_a_task_that_keeps_failing_is_said_when_its_launches_start_waiting(tmp_path):
    # Every trajectory fails; the watchdog looks at the last 16.
    argv, env = train_command(tmp_path, faulty("failing", 1.0, steps=1, drop_window=16))
    res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=500)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]  # the watchdog stops it: nothing can be trained
    said = [x for x in out.splitlines() if x.startswith("warning: task 'FrozenLake': its ")]
    assert len(said) == 1, out[-3000:]  # once per task
    assert said[0].startswith("warning: task 'FrozenLake': its last 8 trajectories failed "
                              "(the latest: env_step_failed: ")
    assert "waits up to 2 s until one succeeds" in said[0]
    assert out.index(said[0]) < out.index("error: task 'FrozenLake': ")  # before the stop
