"""Failures on a real local Ray, through `rollart train` in a subprocess (tiny model).

Bounded in time: every run has a subprocess timeout; a probe loop is bounded in count.
"""

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

from rollart_sdk.control.resume import newest_resumable
from rollart_sdk.ray_utils import actor_pids, descendants

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(1200)

POOLS = [
    {"name": "H800", "hardware": "H800", "kind": "gpu", "profile": "compute", "count": 2},
    {"name": "H20", "hardware": "H20", "kind": "gpu", "profile": "bandwidth", "count": 2},
    {"name": "cpu", "hardware": "cpu", "kind": "cpu", "count": 4},
]


def start(tmp_path, config, *args, env=None):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config))
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               **(env or {}))
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "rollart_sdk.cli", "train", str(cfg), "--no-progress",
         f"output_dir={tmp_path / 'runs'}", "layout=ray", *args],  # worker processes
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
        # A background job of a non-interactive shell (a CI runner's `cmd &`) inherits
        # SIGINT ignored, and Python then keeps ignoring it: the tests send one.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def run_dir(tmp_path, prefix):
    (path,) = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith(prefix)]
    return path


def wait_for_lines(path, n, proc, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early:\n{proc.stdout.read()[-4000:]}")
        metrics = list(tmp for tmp in path.glob("*/metrics.jsonl")) if path.exists() else []
        if metrics and len(metrics[0].read_text().splitlines()) >= n:
            return
        time.sleep(0.5)
    raise AssertionError(f"no {n} metrics lines within {timeout}s")


def finish(proc, timeout):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the run did not end within {timeout}s:\n{out[-4000:]}") from None
    return out


def accounted(summary):
    return summary["launched"] == summary["trained"] + sum(summary["dropped"].values())


def test_killing_an_engine_worker_mid_run_is_survived(tmp_path):
    # Enough steps after the kill for the restarted engine to rejoin and serve again.
    config = two_tasks(name="kill-engine", pools=POOLS, transport={"name": "ray"},
                       train={"steps": 200, "bucket_mb": 1})
    proc = start(tmp_path, config)
    try:
        wait_for_lines(tmp_path / "runs", 2, proc, timeout=400)
        engines = actor_pids("EngineWorker", proc.pid)
        assert engines, descendants(proc.pid)
        victim = engines[0]
        os.kill(victim, signal.SIGKILL)
        out = finish(proc, 500)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    path = run_dir(tmp_path, "kill-engine")
    summary = json.loads((path / "summary.json").read_text())
    assert summary["steps"] == 200 and accounted(summary), summary
    rec = summary["engine_recovery"]
    (victim_name,) = rec["deaths"]
    assert rec["deaths"] == {victim_name: 1} and rec["recovered"] == {victim_name: 1}, rec
    # The console says it when it happens and once more at the end, beside Ray's own
    # "A worker died" line.
    assert f"engine {victim_name} died (" in out, out[-4000:]
    assert f"engine {victim_name} is back after " in out, out[-4000:]
    assert f"engines: {victim_name} died 1x, came back 1x" in out, out[-4000:]
    events = [json.loads(x) for x in (path / "events.jsonl").read_text().splitlines()]
    died = next(e["t0"] for e in events if e["span"] == "worker_died")
    rejoined = next(e for e in events if e["span"] == "worker_rejoined")
    assert rejoined["restarted"] is True
    gen = [e for e in events if e["span"] == "generate"]
    # While it was down its task's requests were served by the other engine; after it
    # rejoined it served again.
    assert any(died < e["t0"] < rejoined["t0"] and e["worker"] != victim_name for e in gen)
    assert any(e["t0"] > rejoined["t1"] and e["worker"] == victim_name for e in gen)
    # Every engine ends on the same, last loaded version: the restarted one reloaded it.
    last = max(u["version"] for u in summary["weight_updates"])
    assert last >= 6 and set(summary["engine_versions"].values()) == {last}, summary
    assert summary["engine_recovery"]["down_at_end"] == {}
    bindings = json.loads((path / "bindings.json").read_text())
    assert any(b.get("restarts", 0) >= 1 for b in bindings), bindings


def read_events(path):
    return [json.loads(x) for x in (path / "events.jsonl").read_text().splitlines()
            if x.strip()]


def wait_for_swap_after_death(tmp_path, prefix, proc, timeout):
    """Wait until events.jsonl shows an engine's death and then a version swapped in (by
    the survivors alone: the dead one is held back meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early:\n{proc.stdout.read()[-4000:]}")
        try:
            events = read_events(run_dir(tmp_path, prefix))
        except (OSError, ValueError):  # not there yet, or a line being written
            events = []
        died = [e["t0"] for e in events if e["span"] == "worker_died"]
        if died and any(e["span"] == "weight_sync" and e["t0"] > died[0] for e in events):
            return
        time.sleep(0.5)
    raise AssertionError(f"no version was swapped in within {timeout}s of the death")


def test_killing_an_engine_under_the_nccl_transport_skips_it_then_reloads_it(tmp_path):
    """Push transport (nccl over gloo): a round waits for meta['receivers'] engines, so a
    dead engine must not be counted: a round staged to it when it died is re-formed for
    the survivor at once (control/weight_updates.py), never waited out, and the rounds
    after it go on with the survivor. The restarted engine is held back
    (ROLLART_HOLD_RESTARTED) until the survivor swapped a version alone, whatever the
    load; then it reloads the served version (sent to it alone by the sender) and takes
    part in the rounds again."""
    hold = tmp_path / "hold-restarted"
    hold.touch()
    config = two_tasks(name="kill-nccl", pools=POOLS, train={"steps": 200, "bucket_mb": 1},
                       transport={"name": "nccl", "options": {
                           "backend": "gloo", "timeout_s": 30, "join_timeout_s": 60}})
    proc = start(tmp_path, config, env={"ROLLART_HOLD_RESTARTED": str(hold)})
    try:
        wait_for_lines(tmp_path / "runs", 2, proc, timeout=300)
        engines = actor_pids("EngineWorker", proc.pid)
        assert engines, descendants(proc.pid)
        os.kill(engines[0], signal.SIGKILL)
        wait_for_swap_after_death(tmp_path, "kill-nccl", proc, timeout=300)
        hold.unlink()  # the restarted engine may come back now
        out = finish(proc, 400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    path = run_dir(tmp_path, "kill-nccl")
    summary = json.loads((path / "summary.json").read_text())
    assert summary["steps"] == 200 and accounted(summary), summary
    rec = summary["engine_recovery"]
    (victim,) = rec["deaths"]
    assert rec["recovered"] == {victim: 1} and rec["failed"] == {}, rec
    assert all(r["left_out"] == [victim] for r in rec["reformed_rounds"]), rec
    (survivor,) = set(summary["engine_versions"]) - {victim}
    events = read_events(path)
    died = next(e["t0"] for e in events if e["span"] == "worker_died")
    rejoined = next(e for e in events if e["span"] == "worker_rejoined")
    assert rejoined["restarted"] is True, rejoined
    swaps = [e for e in events if e["span"] == "weight_sync"]
    # While it was down, versions were swapped in on the survivor alone ...
    alone = [e for e in swaps if died < e["t0"] and e["t1"] < rejoined["t0"]]
    assert alone and {e["worker"] for e in alone} == {survivor}, alone
    # ... it reloaded the version served when it came back (at least the last one the
    # survivor swapped alone) ...
    assert rejoined["version"] >= max(e["version"] for e in alone), (rejoined, alone)
    # ... and after its reload it takes part in the rounds again, on newer versions.
    after = [e["version"] for e in swaps if e["t0"] > rejoined["t1"] and e["worker"] == victim]
    assert after and min(after) > rejoined["version"], after
    # No round waited for the dead engine: at most the one being broadcast when it died
    # failed (its peer gone mid-collective), none for want of its joining.
    failed = [e for e in events if e["span"] == "weight_sync_failed"]
    assert len(failed) <= 1 and all(e["t0"] < rejoined["t0"] for e in failed), failed
    assert not [e for e in failed if "joined within" in e["error"]], failed
    last = max(u["version"] for u in summary["weight_updates"])
    assert set(summary["engine_versions"].values()) == {last}, summary
    assert summary["engine_recovery"]["down_at_end"] == {}


def test_killing_the_env_worker_mid_run_is_survived(tmp_path):
    # The env worker (host of every env process) is SIGKILLed: Ray restarts it, the
    # trajectories in flight on it are dropped and re-run, and the run completes.
    config = two_tasks(name="kill-env", pools=POOLS, transport={"name": "ray"},
                       train={"steps": 30, "bucket_mb": 1, "save_final_model": False})
    proc = start(tmp_path, config)
    try:
        wait_for_lines(tmp_path / "runs", 2, proc, timeout=400)
        hosts = actor_pids("EnvWorker", proc.pid)
        assert hosts, descendants(proc.pid)
        os.kill(hosts[0], signal.SIGKILL)
        out = finish(proc, 500)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads((run_dir(tmp_path, "kill-env") / "summary.json").read_text())
    assert summary["steps"] == 30 and summary["error"] is None and accounted(summary), summary
    # It is back: the run's last steps stepped envs again (on the restarted process).
    metrics = [json.loads(x) for x in
               (run_dir(tmp_path, "kill-env") / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 30


def test_sigint_then_resume_continues_steps_and_metrics(tmp_path):
    # Far more steps than the run can take before the SIGINT lands, even on a fast idle
    # machine (6 steps could all finish first); the resumed leg asks for 3 more steps.
    config = two_tasks(name="resume", transport={"name": "ray"},
                       train={"steps": 500, "bucket_mb": 1, "save_final_model": False})
    proc = start(tmp_path, config)
    try:
        wait_for_lines(tmp_path / "runs", 2, proc, timeout=400)
        proc.send_signal(signal.SIGINT)
        out = finish(proc, 300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-4000:]
    path = run_dir(tmp_path, "resume")
    assert f"--resume {path}" in out  # it says how to continue
    first = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    final = newest_resumable(path)  # the final save: step-<steps trained>
    done = json.loads((final / "run_state.json").read_text())["step"]
    assert final.name == f"step-{done}"
    assert 2 <= done < 500 and [m["step"] for m in first] == list(range(1, len(first) + 1))

    total = done + 3  # train.steps may change on resume
    config["train"]["steps"] = total
    proc = start(tmp_path, config, "--resume", str(path))
    out = finish(proc, 600)
    assert proc.returncode == 0, out[-4000:]
    assert f"resuming from {final} ({done} steps done)" in out
    metrics = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    kept = [m for m in first if m["step"] <= done]
    assert metrics[:len(kept)] == kept  # appended, not rewritten
    assert [m["step"] for m in metrics] == list(range(1, total + 1))
    assert [m["version"] for m in metrics[done:]] == list(range(done, total))
    summary = json.loads((path / "summary.json").read_text())
    assert summary["steps"] == total and summary["resumes"] == 1 and accounted(summary), summary
    assert len(list((tmp_path / "runs").iterdir())) == 1 + 1  # the run dir (and .models)


def test_killing_the_trainer_stops_cleanly_and_says_how_to_resume(tmp_path):
    config = two_tasks(name="kill-trainer", transport={"name": "ray"},
                       train={"steps": 40, "bucket_mb": 1, "checkpoint_every": 2})
    proc = start(tmp_path, config)
    try:
        wait_for_lines(tmp_path / "runs", 3, proc, timeout=400)
        trainers = actor_pids("TrainerWorker", proc.pid)
        assert trainers, descendants(proc.pid)
        os.kill(trainers[0], signal.SIGKILL)
        out = finish(proc, 300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    path = run_dir(tmp_path, "kill-trainer")
    summary = json.loads((path / "summary.json").read_text())
    assert "Actor" in summary["error"] or "actor" in summary["error"], summary["error"]
    assert summary["checkpoint_errors"] and accounted(summary)
    newest = summary["newest_checkpoint"]
    assert newest and (Path(newest) / "run_state.json").is_file()
    assert f"newest checkpoint: {newest}; continue the run with: rollart train" in out
    assert f"--resume {path}" in out
    # the cause in one line, not a traceback (summary.json has the whole error)
    assert "error: a worker died: " in out and "Traceback" not in out, out[-3000:]


def test_sigkill_of_rollart_train_during_a_save_then_resume(tmp_path):
    """kill -9 of `rollart train` (the driver; its Ray actors die with it) while a
    checkpoint is being written: the cut save left only a hidden folder, every complete
    checkpoint passes its manifest, and `--resume` continues from the newest one and
    completes the run, at most one interval (one step) redone."""
    from rollart_sdk.control import checkpoints

    config = two_tasks(name="kill9", transport={"name": "ray"},
                       train={"steps": 8, "bucket_mb": 1, "checkpoint_every": 1,
                              "save_final_model": False})
    proc = start(tmp_path, config)
    try:
        wait_for_lines(tmp_path / "runs", 2, proc, timeout=400)
        path = run_dir(tmp_path, "kill9")
        deadline = time.monotonic() + 120  # a save is in progress about once a step
        while time.monotonic() < deadline and proc.poll() is None:
            if any(p.name.endswith(".partial") for p in (path / "checkpoints").iterdir()):
                break
            time.sleep(0.005)
        lines = len((path / "metrics.jsonl").read_text().splitlines())
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    found = checkpoints.complete(path / "checkpoints")
    assert found and all(checkpoints.verify(c) is None for c in found), found
    assert found[0].step >= lines - 1, (lines, [c.name for c in found])
    proc = start(tmp_path, config, "--resume", str(path))
    out = finish(proc, 600)
    assert proc.returncode == 0, out[-4000:]
    assert f"resuming from {found[0].path} ({found[0].step} steps done)" in out
    assert "skipped" not in out
    metrics = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 9))
    summary = json.loads((path / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["resumes"] == 1 and accounted(summary), summary
    assert all(checkpoints.verify(c) is None for c in checkpoints.complete(path / "checkpoints"))
