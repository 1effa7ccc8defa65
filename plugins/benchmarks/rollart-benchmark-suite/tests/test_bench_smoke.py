"""The straggler and async benchmarks, at tiny sizes, through the ``rollart bench`` CLI.

No speed thresholds (those are the benchmarks' business): the checks are about what each
benchmark runs. Lockstep must pay every turn's slowest environment (a lower bound set by
the sleeping envs), every configuration of the async bench has the same environment
capacity, and the staleness of every trained trajectory respects its mode's bound.
"""

from __future__ import annotations

import json

from rollart_benchmark_suite.straggler import draw_latencies, ideal_times

from rollart_sdk.cli import main
from rollart_sdk.cli.bench import benchmarks


def test_benchmarks_are_registered_through_the_hook(suite_plugins):
    registry = suite_plugins.registry
    assert registry.get("benchmark", "straggler").factory == "rollart_benchmark_suite.straggler:main"
    assert registry.get("benchmark", "async").factory == "rollart_benchmark_suite.async_modes:main"
    # The torch engine plugin registers its own benchmark (installed in the core env).
    assert "engine" in benchmarks() and "dispatch" in benchmarks()


def test_each_bench_has_its_own_help(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        main(["bench", "straggler", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--envs" in out and "--ratios" in out  # the straggler bench's own options
    assert main(["bench"]) == 0 and "async" in capsys.readouterr().out
    assert main(["bench", "stragler"]) == 2
    assert "did you mean 'straggler'" in capsys.readouterr().err


def test_latency_draws_and_ideal_bounds():
    lat = draw_latencies(8, 5, 0.1, 0.1, seed=3)
    assert len(lat) == 8 and all(len(r) == 5 for r in lat)
    assert all(x >= 0 for r in lat for x in r)
    assert lat == draw_latencies(8, 5, 0.1, 0.1, seed=3)  # seeded: both modes replay it
    assert lat != draw_latencies(8, 5, 0.1, 0.1, seed=4)
    # Hand-computed: env 0 takes 1 then 3, env 1 takes 2 then 1. Lockstep waits 2 + 3;
    # each env on its own timeline ends after max(1 + 3, 2 + 1) = 4.
    assert ideal_times([[1.0, 3.0], [2.0, 1.0]]) == (5.0, 4.0)


def test_straggler_bench_batched_pays_each_turns_slowest_env(tmp_path):
    out = tmp_path / "straggler.json"
    rc = main(["bench", "straggler", "--envs", "8", "--turns", "3", "--mu", "0.05",
               "--ratios", "1.0", "--repeats", "1", "--json", str(out)])
    assert rc == 0
    (row,) = json.loads(out.read_text())["rows"]
    # The draws spread (sigma = mu): lockstep's ideal is clearly above the trajectory one.
    assert row["ideal_batched_s"] > row["ideal_trajectory_s"] * 1.2
    # Batched mode (the pipeline's lockstep barrier) cannot finish before the sum over turns
    # of the slowest env: it would if it did not wait. Trajectory mode cannot finish before
    # its slowest env's own sum.
    assert row["batched_s"] >= row["ideal_batched_s"]
    assert row["trajectory_s"] >= row["ideal_trajectory_s"]
    assert row["generate_s_mean"] > 0 and row["batched_generate_s_mean"] > 0


def test_async_bench_equal_capacity_and_bounds(tmp_path):
    out = tmp_path / "async.json"
    rc = main(["bench", "async", "--steps", "2", "--turns", "2", "--mu", "0.005",
               "--batch", "4", "--group", "2", "--max-envs", "8", "--repeats", "1", "--tiny",
               "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert [(r["mode"], r["interaction"], r["alpha"]) for r in rows] == [
        ("sync", "batched", 0), ("sync", "trajectory", 0), ("one_off", "trajectory", 0),
        ("async", "trajectory", 0), ("async", "trajectory", 1), ("async", "trajectory", 2)]
    for r in rows:
        assert r["steps"] == 2 and r["trajectories_trained"] == 8
        assert sum(r["staleness_hist"].values()) == 8
        assert max(int(k) for k in r["staleness_hist"]) <= r["alpha"]
        # Every launch is trained or counted as dropped.
        assert r["launched"] == r["trajectories_trained"] + sum(r["dropped"].values())
        # The bound: every repeat at most its own bound, from the drawn env latency of
        # its trained trajectories and the trainer's fastest step.
        assert r["within_bound_runs"] == [True]
        assert 0 < r["run_trajectories_per_s"] <= r["bound_trajectories_per_s"]
        env_bound = r["max_envs"] / r["env_sleep_mean_s"]
        assert r["bound_trajectories_per_s"] == min(env_bound, 4 / res["min_train_s"])
        assert 0 < r["env_sleep_mean_s"] < 0.03  # 1-2 turns of N(5 ms, 2.5 ms)
        if r["mode"] != "async":
            # Equal capacity: sync and one_off fill all 8 envs every iteration (redundancy),
            # twice the batch; the surplus is aborted or dropped, never trained.
            assert r["launched"] == 2 * 8
            assert r["dropped"].get("aborted:surplus", 0) + r["dropped"].get("surplus", 0) > 0
    for r in rows[:2]:
        assert r["staleness_hist"] == {"0": 8}
    assert res["bound_exceeded"] == []


def test_the_async_bound_is_the_tighter_of_env_and_trainer_capacity():
    from rollart_benchmark_suite.async_modes import apply_bounds

    def run(tps, sleep, train):
        return {"max_envs": 16, "batch_size": 8, "env_sleep_mean_s": sleep,
                "train_s_steps": train, "run_trajectories_per_s": tps}

    # Env-bound: 16 envs / 0.4 s each = 40/s; trainer 8 / 0.1 s (the fastest step of any
    # run, here the second run's) = 80/s.
    a, b = run(30.0, 0.4, [0.5, 0.2]), run(45.0, 0.1, [0.1, 0.3])
    assert apply_bounds([a, b]) == 0.1
    assert (a["env_bound_trajectories_per_s"], a["trainer_bound_trajectories_per_s"]) == (40, 80)
    assert a["bound_trajectories_per_s"] == 40 and a["within_bound"]
    # Trainer-bound (env 160/s): 45 trajectories/s is within 80.
    assert b["bound_trajectories_per_s"] == 80 and b["within_bound"]
    c = run(50.0, 0.4, [0.2])  # faster than 16 envs can serve episodes of 0.4 s
    apply_bounds([c])
    assert c["bound_trajectories_per_s"] == 40 and not c["within_bound"]


def test_soak_memory_figures_measure_growth_after_warm_up():
    from rollart_benchmark_suite.soak import memory_figures

    # 100 MiB until warm-up ends at 60 s, then +1 MiB every 10 s (110 MiB at 160 s); the
    # end is the median of the last 3 samples (108, 109, 110).
    samples = [(t, 100.0 + max(0, t - 60) / 10, 0) for t in range(0, 170, 10)]
    fig = memory_figures(samples, warm_s=60)
    assert fig["rss_warm_mib"] == 100.0 and fig["rss_end_mib"] == 109.0
    assert fig["growth_pct"] == 9.0 and fig["slope_mib_per_h"] == 360.0
    flat = memory_figures([(t, 200.0, 0) for t in range(0, 100, 10)], warm_s=30)
    assert flat["growth_pct"] == 0.0 and flat["slope_mib_per_h"] == 0.0
    assert memory_figures(samples[:3], warm_s=0)["growth_pct"] is None  # too few samples
