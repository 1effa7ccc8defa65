"""ReplicaMonitor over several applications (rollart bench reward's dedicated arm): one
status call per poll for all of them, a change history per application, and the
replica-seconds integral summed over them. Serve's status is replaced by a scripted
sequence here; the real Serve path is exercised in the serverless plugin's tests."""

from __future__ import annotations

import threading

import pytest

from rollart_sdk.cluster import serve_app
from rollart_sdk.cluster.serve_app import ReplicaMonitor


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

    def counts(apps, states):
        calls.append(tuple(apps))
        if len(calls) >= len(script):
            done.set()
        return script[min(len(calls), len(script)) - 1]

    monkeypatch.setattr(serve_app, "replica_counts", counts)
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
