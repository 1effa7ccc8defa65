"""ReplicaMonitor over several applications (rollart bench reward's dedicated arm): one
status call per poll for all of them, a change history per application, and the
replica-seconds integral summed over them. Serve's status is replaced by a scripted
sequence here; the real Serve path is exercised in the serverless plugin's tests."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from rollart_sdk.serverless import deploy as serve_app
from rollart_sdk.serverless.deploy import ReplicaMonitor


def test_replica_seconds_sums_each_applications_integral():
    monitor = ReplicaMonitor(["a", "b"], emit=lambda line: None)
    monitor.histories["a"] = [(0.0, 0), (2.0, 1), (12.0, 0)]  # one replica for 10 s
    monitor.histories["b"] = [(0.0, 0), (4.0, 2), (7.0, 1), (9.0, 0)]  # 2*3 + 1*2 = 8
    assert monitor.replica_seconds() == pytest.approx(18.0)
    assert monitor.replica_seconds(until=8.0) == pytest.approx(6.0 + 2 * 3 + 1 * 1)
    assert monitor.app == "a" and monitor.history is monitor.histories["a"]


def test_one_status_call_per_poll_records_changes_per_application(monkeypatch):
    script = [{"a": 0, "b": 0}, {"a": 1, "b": 0}, {"a": 1, "b": 1}, {"a": 1, "b": 1},
              {"a": 0, "b": 1}, {"a": 0, "b": 0}]
    calls: list[tuple[str, ...]] = []
    done = threading.Event()

    def states(apps):
        calls.append(tuple(apps))
        if len(calls) >= len(script):
            done.set()
        snap = script[min(len(calls), len(script)) - 1]
        return {app: {"RUNNING": n} for app, n in snap.items()}

    monkeypatch.setattr(serve_app, "replica_states", states)
    lines: list[str] = []
    monitor = ReplicaMonitor(["a", "b"], emit=lines.append, interval_s=0.01).start()
    try:
        assert done.wait(30), "the monitor did not poll"
    finally:
        monitor.stop()
    assert all(c == ("a", "b") for c in calls)  # both apps in every single call
    assert [n for _, n in monitor.histories["a"]] == [0, 1, 0]
    assert [n for _, n in monitor.histories["b"]] == [0, 1, 0]
    assert any(line.startswith("[a] replicas: 0 -> 1") for line in lines)


def _snapshot(**replicas):
    """A ``serve.status().applications`` mapping: app -> one deployment whose
    ``replica_states`` is keyed by Serve's own ReplicaState enum."""
    from ray.serve._private.common import ReplicaState

    return {app: SimpleNamespace(deployments={"Judge": SimpleNamespace(replica_states={
        ReplicaState(state): n for state, n in by_state.items()})})
        for app, by_state in replicas.items()}


def test_replica_changes_count_running_replicas_never_above_max_replicas():
    """A replacement (one replica STOPPING while the next is STARTING, then RUNNING) holds
    two replicas of a max_replicas=1 deployment: the held history says 2, the RUNNING one
    (the bench's replica_changes) never exceeds 1, and starts/stops count RUNNING moves."""
    held = ("STARTING", "RUNNING", "STOPPING")
    monitor = ReplicaMonitor("judge", emit=lambda line: None, states=held)
    polls = [
        _snapshot(),  # not deployed yet
        _snapshot(judge={"STARTING": 1}),
        _snapshot(judge={"RUNNING": 1}),
        _snapshot(judge={"STOPPING": 1, "STARTING": 1}),  # replaced
        _snapshot(judge={"STOPPING": 1, "RUNNING": 1}),
        _snapshot(judge={"RUNNING": 1}),
        _snapshot(judge={"STOPPING": 1}),  # scale to zero
        _snapshot(judge={}),
    ]
    for t, apps in enumerate(polls):
        monitor.observe(serve_app.states_of(apps, monitor.apps), float(t))
    assert [n for _, n in monitor.histories["judge"]] == [0, 1, 2, 1, 0]
    assert [n for _, n in monitor.running["judge"]] == [0, 1, 0, 1, 0]
    assert max(n for _, n in monitor.running["judge"]) <= 1  # max_replicas
    assert monitor.starts == {"judge": 2} and monitor.stops == {"judge": 2}
    # held: 1 replica over [1, 3), 2 over [3, 5), 1 over [5, 7)
    assert monitor.replica_seconds() == pytest.approx(2 + 4 + 2)
