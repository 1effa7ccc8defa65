"""``rollart bench reward`` at the smallest size: two jobs, one step, a tiny judge. No
speed thresholds (the bench reports those): the checks are about what each arm runs -
one reserved replica per job vs one shared deployment that scales from zero and back,
the same jobs (seeds, workload) in both, every trajectory judged, busy <= reserved."""

from __future__ import annotations

import json

import pytest

from rollart_sdk.serverless.deploy import TOKEN_ENV

TINY_JUDGE = {"parser": "likelihood", "template": "Here is a {info[category]}:",
              "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                                 "intermediate_size": 64}}}
SMALL = {"env_mu_s": 0.05, "env_sigma_s": 0.0, "batch_size": 4, "group_size": 2, "max_envs": 4}


@pytest.mark.slow
@pytest.mark.timeout(600)  # four training jobs and Ray Serve: 300 s ran out in CI under load
def test_bench_reward_runs_both_arms_on_the_same_jobs(tmp_path, monkeypatch):
    from rollart_reward_serverless.bench import main

    monkeypatch.setenv(TOKEN_ENV, "replaced-by-the-bench")  # restored after the test
    out = tmp_path / "bench.json"
    assert main(["--jobs", "2", "--steps", "1", "--repeats", "1", "--idle-s", "1",
                 "--workload", json.dumps(SMALL), "--judge", json.dumps(TINY_JUDGE),
                 "--out", str(tmp_path / "runs"), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = {r["deployment"]: r for r in data["rows"]}
    assert set(rows) == {"dedicated", "serverless"} and set(data["median"]) == set(rows)
    assert data["meta"]["jobs"] == 2 and len(data["meta"]["load_average"]) == 3
    for row in rows.values():
        for key in ("replica_utilisation", "rollout_step_s", "reward_latency_p50_s",
                    "exposed_reward_s", "jobs"):
            assert row[key] is not None, (key, row)
        assert 0 < row["busy_s"] <= row["reserved_s"] and 0 < row["replica_utilisation"] <= 1
        assert row["judged"] >= row["trained"] >= 2 * SMALL["batch_size"]
        # every reserved second is accounted for: cold start, busy, idle, tail, pre-log
        assert sum(row["reserved_parts_s"].values()) == pytest.approx(row["reserved_s"],
                                                                      abs=0.05)
        assert row["utilisation_serving"] >= row["replica_utilisation"]
    assert rows["dedicated"]["replicas"] == 2  # one reserved per job
    assert 1 <= rows["serverless"]["replicas"] <= 2  # shared, autoscaled (max 2)
    changes = rows["serverless"]["replica_changes"]
    assert changes[0] == 0 and max(changes) >= 1 and changes[-1] == 0  # from zero, back
    # The same jobs in both arms: seeds and workload; only the reward URL differs.
    for j in range(2):
        ded, srv = (json.loads((tmp_path / "runs" / f"{arm}-r0" / f"job{j}.spec.json")
                               .read_text()) for arm in ("dedicated", "serverless"))
        assert (ded["seed"], ded["workload"]) == (srv["seed"], srv["workload"])
        assert ded["url"] != srv["url"]


def _replica(directory, name, events):
    directory.mkdir(exist_ok=True)
    (directory / f"replica-{name}.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in events))


def _result(dropped):
    return {"steps": [{"step_s": 10.0, "exposed_reward_s": 0.5},
                      {"step_s": 10.0, "exposed_reward_s": 0.0}],
            "reward_latencies_s": [0.2, 0.3, 0.4], "trained": 8, "dropped": dropped,
            "run_started": 0.0, "run_ended": 20.0}


def test_summarise_accounts_for_every_reserved_second_and_counts_faults_only(tmp_path):
    """The row says where the reserved time went (cold start, busy, idle, idle tail, and
    Serve's hold before a replica's log starts); the full utilisation keeps all of it, the
    serving-only figure sits beside it; run-end discards are not faults."""
    from rollart_reward_serverless.bench import summarise

    logs = tmp_path / "replicas"
    _replica(logs, "a", [{"event": "created", "t": 0.0}, {"event": "ready", "t": 10.0},
                         {"event": "busy", "t": 40.0, "t0": 10.0, "t1": 40.0, "calls": 30},
                         {"event": "busy", "t": 50.0, "t0": 45.0, "t1": 50.0, "calls": 5},
                         {"event": "closed", "t": 55.0}])
    _replica(logs, "b", [{"event": "created", "t": 20.0}, {"event": "ready", "t": 30.0},
                         {"event": "closed", "t": 35.0}])  # started, never served
    results = [_result({"aborted:run_end": 3, "group_incomplete": 1}),
               _result({"reward:timeout": 2, "aborted:run_end": 1})]
    row = summarise("serverless", results, logs, held_s=70.0)
    parts = row["reserved_parts_s"]
    assert parts == {"start_up_s": 20.0, "busy_s": 35.0, "idle_s": 5.0, "tail_s": 10.0,
                     "before_log_s": 0.0}
    assert row["reserved_logged_s"] == 70.0 and row["reserved_s"] == 70.0
    assert row["replica_utilisation"] == round(35.0 / 70.0, 4)  # cold starts, tails kept in
    assert row["utilisation_serving"] == round(35.0 / 40.0, 4)  # labelled apart, higher
    assert [p["calls"] for p in row["replica_parts_s"]] == [35, 0]
    assert row["dropped"] == 2 and row["discarded_at_end"] == 5
    # Serve held the replicas longer than they logged: reserved grows, and the extra is
    # accounted as before_log_s (the actor's start before its constructor ran).
    held = summarise("serverless", results, logs, held_s=80.0)
    assert held["reserved_s"] == 80.0 and held["reserved_parts_s"]["before_log_s"] == 10.0
    assert sum(held["reserved_parts_s"].values()) == pytest.approx(held["reserved_s"])
    assert held["replica_utilisation"] == round(35.0 / 80.0, 4)


def test_both_arms_deploy_the_same_replica_and_only_serverless_autoscales(tmp_path):
    """The Serve deployments the bench builds (Ray Serve's own config objects): the same
    judge, CPUs and per-replica concurrency in both arms; dedicated pinned to one replica
    per job; serverless from zero to at most the dedicated arm's replicas, adding one only
    for a backlog beyond one replica's batch that outlasts a cold start."""
    from rollart_reward_serverless.bench import Arm, parse_args

    from rollart_sdk.serverless.deploy import _deployment

    args = parse_args(["--out", str(tmp_path)])
    assert args.max_replicas == args.jobs == 3
    dedicated = _deployment(Arm(args, "dedicated", 0, 8000).options("d", 1, 1))
    shared = _deployment(Arm(args, "serverless", 0, 8000).options("s", 0, args.max_replicas))
    for dep in (dedicated, shared):
        assert dep.ray_actor_options == {"num_cpus": 0.5}
        assert dep._deployment_config.max_ongoing_requests == 64
    ded = dedicated._deployment_config.autoscaling_config
    srv = shared._deployment_config.autoscaling_config
    assert (ded.min_replicas, ded.max_replicas) == (1, 1)
    assert (srv.min_replicas, srv.initial_replicas, srv.max_replicas) == (0, 0, 3)
    assert srv.target_ongoing_requests == 32 and srv.upscale_delay_s == 30
    assert srv.downscale_to_zero_delay_s == args.idle_s
    # Flags reach the deployment (a user can size them to another judge).
    args = parse_args(["--out", str(tmp_path), "--jobs", "4", "--target-ongoing", "8",
                       "--upscale-delay-s", "5", "--max-replicas", "2"])
    srv = _deployment(Arm(args, "serverless", 1, 8000).options("s", 0, args.max_replicas)
                      )._deployment_config.autoscaling_config
    assert (srv.max_replicas, srv.target_ongoing_requests, srv.upscale_delay_s) == (2, 8, 5)


def test_every_dedicated_app_is_deleted_when_the_jobs_end_together(tmp_path, monkeypatch):
    """Jobs that end after the last poll: each one's own reservation is deleted (the last
    loop once deleted one app and marked another job's app deleted, and the bench then
    waited 60 s for a replica nobody had removed: CI, 5 Dec)."""
    import argparse
    import subprocess
    import sys

    from ray import serve
    from rollart_reward_serverless.bench import Arm

    deleted: list[str] = []
    monkeypatch.setattr(serve, "delete", lambda app, _blocking=True: deleted.append(app))
    args = argparse.Namespace(out=str(tmp_path), jobs=2, job_timeout_s=30)
    arm = Arm(args, "dedicated", 0, 8000)
    arm.procs = {j: subprocess.Popen([sys.executable, "-c", "pass"]) for j in range(2)}
    for p in arm.procs.values():
        p.wait(timeout=30)
    arm.apps = {0: "r3-dedicated-r0-j0", 1: "r3-dedicated-r0-j1"}
    arm._wait_jobs()
    assert sorted(deleted) == ["r3-dedicated-r0-j0", "r3-dedicated-r0-j1"]
    assert arm.apps == {0: None, 1: None}
