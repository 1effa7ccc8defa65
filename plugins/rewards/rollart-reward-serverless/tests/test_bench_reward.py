"""``rollart bench reward`` at the smallest size: two jobs, one step, a tiny judge. No
speed thresholds (the bench reports those): the checks are about what each arm runs -
one reserved replica per job vs one shared deployment that scales from zero and back,
the same jobs (seeds, workload) in both, every trajectory judged, busy <= reserved."""

from __future__ import annotations

import json

import pytest

from rollart_sdk.cluster.serve_app import TOKEN_ENV

TINY_JUDGE = {"parser": "likelihood", "template": "Here is a {info[category]}:",
              "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                                 "intermediate_size": 64}}}
SMALL = {"env_mu_s": 0.05, "env_sigma_s": 0.0, "batch_size": 4, "group_size": 2, "max_envs": 4}


@pytest.mark.slow
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
