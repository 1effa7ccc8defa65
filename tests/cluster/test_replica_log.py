"""A reward replica's own log (rollart_sdk.serverless.replica_log): busy intervals are the
union of calls in flight, reserved time runs from created to closed (or the last sign of
life), and a log that does not start with "created" is refused."""

from __future__ import annotations

import json

import pytest

from rollart_sdk.serverless.replica_log import ReplicaLog, read_usage


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_overlapping_calls_are_one_busy_interval_and_reserved_runs_to_closed(tmp_path):
    log = ReplicaLog(tmp_path, heartbeat_s=60)
    log.write("ready")
    log.begin()
    log.begin()  # a second call while the first is in flight
    log.end()
    log.end()
    log.begin()
    log.end()
    log.close()
    events = [e["event"] for e in _lines(log.path)]
    assert events == ["created", "ready", "busy", "busy", "closed"]
    busy = [e for e in _lines(log.path) if e["event"] == "busy"]
    assert [b["calls"] for b in busy] == [2, 1]
    (usage,) = read_usage(tmp_path)
    assert usage.closed and usage.calls == 3
    assert usage.busy_s == pytest.approx(sum(b["t1"] - b["t0"] for b in busy))
    assert 0 <= usage.busy_s <= usage.reserved_s
    assert usage.start_up_s is not None and usage.start_up_s >= 0


def test_a_replica_killed_mid_call_ends_at_its_last_sign_of_life(tmp_path):
    log = ReplicaLog(tmp_path, heartbeat_s=60)
    log.begin()
    log.end()
    log.begin()  # killed here: no "closed", and the open call never ends
    lines = _lines(log.path)
    (usage,) = read_usage(tmp_path)
    assert not usage.closed and usage.ready is None
    assert usage.ended == max(max(e["t"], e.get("t1", 0.0)) for e in lines)
    log.close()  # closing while a call is in flight counts that interval as busy
    assert [e["event"] for e in _lines(log.path)][-2:] == ["busy", "closed"]


def test_read_usage_refuses_a_log_without_created(tmp_path):
    (tmp_path / "replica-x.jsonl").write_text(json.dumps({"event": "alive", "t": 1.0}) + "\n")
    with pytest.raises(ValueError, match="created"):
        read_usage(tmp_path)


def _usage_from(tmp_path, events):
    (tmp_path / "replica-a.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (usage,) = read_usage(tmp_path)
    return usage


def test_breakdown_splits_reserved_time_into_start_up_busy_idle_and_tail(tmp_path):
    usage = _usage_from(tmp_path, [
        {"event": "created", "t": 100.0}, {"event": "ready", "t": 110.0},  # 10 s cold start
        {"event": "busy", "t": 115.0, "t0": 111.0, "t1": 115.0, "calls": 3},
        {"event": "busy", "t": 120.0, "t0": 117.0, "t1": 120.0, "calls": 1},  # last call ends at 120
        {"event": "alive", "t": 121.0}, {"event": "closed", "t": 126.0}])  # 6 s idle tail
    parts = usage.breakdown()
    assert parts == pytest.approx({"start_up_s": 10.0, "busy_s": 7.0, "idle_s": 3.0,
                                   "tail_s": 6.0})
    assert sum(parts.values()) == pytest.approx(usage.reserved_s) == pytest.approx(26.0)
    assert usage.last_busy == 120.0 and usage.calls == 4


def test_breakdown_of_a_replica_that_never_served_or_died_starting(tmp_path):
    never = _usage_from(tmp_path, [{"event": "created", "t": 0.0}, {"event": "ready", "t": 4.0},
                                   {"event": "closed", "t": 9.0}])
    assert never.breakdown() == pytest.approx(
        {"start_up_s": 4.0, "busy_s": 0.0, "idle_s": 0.0, "tail_s": 5.0})
    starting = _usage_from(tmp_path, [{"event": "created", "t": 0.0},
                                      {"event": "alive", "t": 3.0}])  # killed while loading
    assert not starting.closed and starting.breakdown() == pytest.approx(
        {"start_up_s": 3.0, "busy_s": 0.0, "idle_s": 0.0, "tail_s": 0.0})
