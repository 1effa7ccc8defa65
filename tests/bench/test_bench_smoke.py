"""The straggler and async benchmarks, at tiny sizes, through the ``rollart bench`` CLI.

Only structure and invariants are checked (no wall-clock thresholds): the ideal bounds
follow from the latency draws, and the staleness of every trained trajectory respects the
mode's bound.
"""

from __future__ import annotations

import json

from rollart_sdk.bench.straggler import draw_latencies, ideal_times
from rollart_sdk.cli import BENCHMARKS, main


def test_benchmarks_are_listed():
    assert BENCHMARKS["straggler"][0] == "rollart_sdk.bench.straggler:main"
    assert BENCHMARKS["async"][0] == "rollart_sdk.bench.async_modes:main"


def test_latency_draws_and_ideal_bounds():
    lat = draw_latencies(8, 5, 0.1, 0.1, seed=3)
    assert len(lat) == 8 and all(len(r) == 5 for r in lat)
    assert all(x >= 0 for r in lat for x in r)
    assert lat == draw_latencies(8, 5, 0.1, 0.1, seed=3)  # seeded: both modes replay it
    batched, trajectory = ideal_times(lat)
    assert batched == sum(max(r[t] for r in lat) for t in range(5))
    assert batched >= trajectory > 0
    # No spread: every env takes the same time, waiting for the slowest costs nothing.
    flat = [[0.1] * 4 for _ in range(3)]
    b, t = ideal_times(flat)
    assert abs(b - t) < 1e-12


def test_straggler_bench_json(tmp_path):
    out = tmp_path / "straggler.json"
    rc = main(["bench", "straggler", "--envs", "3", "--turns", "2", "--mu", "0.01",
               "--ratios", "0.1", "1.0", "--repeats", "1", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert [r["sigma_over_mu"] for r in res["rows"]] == [0.1, 1.0]
    for r in res["rows"]:
        assert r["speedup"] > 0 and r["ideal_speedup"] >= 1.0
        assert r["trajectory_s"] > 0 and r["batched_s"] > 0
        assert r["ideal_batched_s"] >= r["ideal_trajectory_s"] > 0
        assert r["speedup"] == r["batched_s"] / r["trajectory_s"]
        assert r["generate_s_mean"] > 0  # the engine really served the turns


def test_async_bench_json(tmp_path):
    out = tmp_path / "async.json"
    rc = main(["bench", "async", "--steps", "2", "--turns", "2", "--mu", "0.005",
               "--batch", "4", "--group", "2", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert [(r["mode"], r["alpha"]) for r in rows] == [("sync", 0), ("one_off", 1),
                                                        ("async", 1), ("async", 2)]
    for r in rows:
        assert r["steps"] == 2 and r["trajectories_trained"] == 8
        assert r["step_time_s"] > 0 and r["trajectories_per_s"] > 0
        assert sum(r["staleness_hist"].values()) == r["trajectories_trained"]
        assert r["staleness_max"] <= r["alpha"]
        assert max(int(k) for k in r["staleness_hist"]) == r["staleness_max"]
        # Every launch is trained or counted as dropped.
        assert r["launched"] == r["trajectories_trained"] + sum(r["dropped"].values())
    sync = rows[0]
    assert sync["staleness_hist"] == {"0": 8} and sync["aborted_stale"] == 0
