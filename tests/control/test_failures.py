"""Faults injected into real envs (tasks[].env.faults), the control plane in-process.

Each env runs in its own process (EnvHost); engines, trainer and rewards are the real torch
and rule backends. The same faults on Ray: tests/control/test_failures_ray.py.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time

import pytest
from control_configs import TWO_TASKS

from rollart_sdk.config import load_config
from rollart_sdk.control.watchdog import RunFailure
from rollart_sdk.job import build_job, run_job


def one_task(**task):
    data = copy.deepcopy(TWO_TASKS)
    data["roles"] = {"actor_gen": {"workers": 1}}
    data["tasks"] = [{
        "tag": "Arithmetic",
        "env": {"name": "arithmetic", "options": {"num_digits": 1, "ops": ["+"]}},
        "reward": {"name": "rule", "options": {"mode": "exact_match"}},
        "max_turns": 1, "system_prompt": None, "sampling": {"max_new_tokens": 4},
        "step_timeout_s": 20, "reset_timeout_s": 20, **task,
    }]
    return data


def run(tmp_path, data, overrides=(), steps=3):
    cfg, lines = load_config(data=copy.deepcopy(data), overrides=[f"output_dir={tmp_path}", *overrides])
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    try:
        records = run_job(job, steps, progress=False)
    finally:
        job.close()
    return job, records


def metrics_lines(tmp_path):
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return run_dir, [json.loads(x) for x in lines]


def check_accounting(job, tmp_path, steps):
    p = job.pipeline
    dropped = sum(p.buffer.dropped.values())
    assert p.scheduler.launched == p.buffer.trained + dropped
    run_dir, metrics = metrics_lines(tmp_path)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    for m in metrics:  # at every step: launched = trained + dropped + still in flight
        assert m["trajectories/launched"] == (m["trajectories/trained"] + m["trajectories/dropped"]
                                              + m["trajectories/in_flight"]), m
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["launched"] == summary["trained"] + sum(summary["dropped"].values())
    return summary


@pytest.mark.parametrize("mode", ["sync", "one_off"])
def test_quota_modes_complete_with_20_percent_env_failures(tmp_path, mode):
    faults = {"reset_error": 0.2, "step_error": 0.2}
    job, records = run(tmp_path, one_task(), [f"rollout.mode={mode}",
                                              f"tasks.0.env.faults={json.dumps(faults)}"])
    assert len(records) == 3
    summary = check_accounting(job, tmp_path, 3)
    assert summary["dropped"]["env_reset_failed"] > 0 and summary["dropped"]["env_step_failed"] > 0
    assert job.pipeline.scheduler.retried > 0  # failed members were re-run in their group
    # Group-preserving: every trained group is whole (group_size members, none dropped).
    for r in records:
        groups: dict[str, int] = {}
        for t in r.batch:
            assert t.dropped is None
            groups[t.group_id] = groups.get(t.group_id, 0) + 1
        assert set(groups.values()) == {4} and sum(groups.values()) == 8


def test_always_failing_task_stops_the_run_naming_it(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RunFailure, match="task 'Arithmetic'.*env_reset_failed") as err:
        run(tmp_path, one_task(), ["tasks.0.env.faults.reset_error=1.0", "rollout.mode=sync"])
    assert err.value.task == "Arithmetic"
    assert time.monotonic() - t0 < 600  # hang guard (start-up included)
    run_dir, _ = metrics_lines(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    # Stopped by the drop-rate rule as soon as its window filled, not by the stall timeout.
    assert "trajectories were dropped (rollout.max_drop_rate" in str(err.value)
    assert "no progress for" not in str(err.value)
    assert summary["trained"] == 0
    assert summary["error"].startswith("RunFailure: task 'Arithmetic'")
    assert summary["launched"] == summary["trained"] + sum(summary["dropped"].values())
    assert (run_dir / "checkpoints" / "step-0" / "trainer_state.json").exists()  # final
    drops = (run_dir / "drops.jsonl").read_text().splitlines()
    assert "injected reset error" in drops[0]


def test_hanging_env_steps_are_killed_and_the_run_goes_on(tmp_path):
    # 10 % of steps hang for an hour; each is killed at step_timeout_s (its process).
    job, records = run(tmp_path, one_task(step_timeout_s=3.0),
                       ["tasks.0.env.faults.hang=0.1", "tasks.0.env.faults.hang_s=3600"],
                       steps=3)
    assert len(records) == 3
    summary = check_accounting(job, tmp_path, 3)
    assert summary["dropped"].get("env_step_timeout", 0) + summary["dropped"].get(
        "env_reset_timeout", 0) > 0
    env = job.pipeline.scheduler.env_workers[0].target
    assert env.killed > 0 and env.stats()["live"] == 0  # hung envs killed, every other closed


SIGTERM_SCRIPT = """
import copy, sys
sys.path.insert(0, {tests!r})
from test_failures import one_task
from rollart_sdk.config import load_config
from rollart_sdk.job import build_job, run_job
cfg, lines = load_config(data=copy.deepcopy(one_task(**{task!r})),
                         overrides=["output_dir={out}", *{overrides!r}])
job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
try:
    run_job(job, 200, progress=False)
except KeyboardInterrupt:
    sys.exit(143 if job.signal == "SIGTERM" else 130)
finally:
    job.close()
"""


def test_sigterm_is_handled_like_ctrl_c(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "runs"
    script = SIGTERM_SCRIPT.format(tests=str(Path(__file__).parent), out=out, task={},
                                   overrides=[])
    proc = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            lines = [p for p in out.glob("*/metrics.jsonl") if p.read_text().count("\n") >= 2]
            if lines or proc.poll() is not None:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before the signal"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    (run_dir,) = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] and summary["signal"] == "SIGTERM"
    # Steps trained, each with its metrics line (a batch whose step the signal cut is not one).
    assert summary["steps"] == len((run_dir / "metrics.jsonl").read_text().splitlines())
    assert summary["launched"] == summary["trained"] + sum(summary["dropped"].values())
    newest = Path(summary["newest_checkpoint"])  # the final save: step-<steps trained>
    assert newest.parent == run_dir / "checkpoints" and newest.name.startswith("step-")
    assert (newest / "trainer_state.json").exists() and (newest / "manifest.json").exists()


def test_trajectories_landing_count_as_in_flight_at_every_step(tmp_path, monkeypatch):
    """A finished trajectory leaves `running` and then awaits its env slot's return (a
    failed env closed and replaced can take seconds) before it is counted: meanwhile it is
    still in flight. CI once saw a step's metrics line short by one (launched 28 = trained
    16 + dropped 4 + in flight 7) during such a wait. Here the first batch (groups g1, g2)
    lands only once the second batch's group g3 (launched beside it: alpha 1) is landing
    (each returns its slot first, so g3 can run), and g3 lands 1.5 s later: a step's line
    is formed while trajectories land (which step depends on which groups fill a batch)."""
    from rollart_sdk.control.pipeline import Pipeline
    from rollart_sdk.control.scheduler import RolloutScheduler

    real = RolloutScheduler._return_slot
    g3_landing: list[str] = []
    g3_all_landing = asyncio.Event()

    async def slow_return(self, traj):
        out = await real(self, traj)  # the slot is free again; the trajectory not counted
        if traj.group_id == "g3":
            g3_landing.append(traj.trajectory_id)
            if len(g3_landing) == 4:
                g3_all_landing.set()
            await asyncio.sleep(1.5)
        elif traj.group_id in ("g1", "g2"):
            try:  # bounded: g3 may only start once the first batch trained
                await asyncio.wait_for(g3_all_landing.wait(), 5)
            except TimeoutError:
                pass
        return out

    landing_at_record = []
    record = Pipeline._record

    def spy(self, step, batch, wait_s, served, early=None):
        landing_at_record.append(len(self.scheduler.landing))
        return record(self, step, batch, wait_s, served, early)

    monkeypatch.setattr(RolloutScheduler, "_return_slot", slow_return)
    monkeypatch.setattr(Pipeline, "_record", spy)
    job, records = run(tmp_path, one_task(), steps=4)
    assert len(records) == 4
    assert max(landing_at_record) > 0, landing_at_record  # the case arose
    check_accounting(job, tmp_path, 4)  # launched = trained + dropped + in flight, per step
    assert job.pipeline.scheduler.landing == {}  # every landing one was counted by the end


def test_a_stop_does_not_wait_for_env_steps_that_run_on(tmp_path):
    """SIGTERM while every env is inside an hour-long call (its reset and step timeouts
    10 minutes): the run gives its episodes a few seconds, then cancels them, kills the
    env processes still busy, writes its checkpoint and summary and exits. Before, the
    stop waited 60 s for the episodes and then each busy env's close for its call."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "runs"
    script = SIGTERM_SCRIPT.format(
        tests=str(Path(__file__).parent), out=out,
        task={"step_timeout_s": 600, "reset_timeout_s": 600, "env_host": "worker"},
        overrides=["tasks.0.env.faults.hang=1.0", "tasks.0.env.faults.hang_s=3600",
                   "rollout.stall_timeout_s=900"])
    proc = subprocess.Popen([sys.executable, "-c", script],
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # the run's start-up done
            if list(out.glob("*/plan.json")) or proc.poll() is not None:
                break
            time.sleep(0.2)
        time.sleep(10.0)  # every episode inside its hanging reset
        assert proc.poll() is None, "the run ended before the signal"
        proc.send_signal(signal.SIGTERM)
        # The old stop waited 60 s for the episodes before the busy closes: a stop that
        # still waits for the env calls does not exit within this guard.
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    (run_dir,) = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] and summary["trained"] == 0
    assert summary["launched"] > 0
    assert summary["launched"] == sum(summary["dropped"].values())  # each counted once
