"""Calibration: the cost model fitted to this machine's torch engine and trainer predicts
a short real CPU run's median step time within 20 % (docs/simulation.md, "Calibration").

The real run is the real thing (torch engine, torch trainer, FrozenLake and arithmetic
envs, in process); the simulation gets the engine and trainer costs fitted on fresh
instances, and the workload (turns, tokens, env and reward latencies) measured from the
real run - never its generation, training or step times, which are what it predicts."""

from __future__ import annotations

import pytest

from rollart_sdk.sim.calibrate import calibration_check, least_squares

REAL = {
    "name": "calib",
    "seed": 0,
    "model": {"tiny": {"hidden_size": 256, "num_layers": 4, "num_heads": 4,
                       "intermediate_size": 512, "max_position_embeddings": 512}},
    "pools": [{"name": "gen", "hardware": "cpu", "kind": "gpu", "count": 1},
              {"name": "train", "hardware": "cpu", "kind": "gpu", "count": 1},
              {"name": "cpu", "hardware": "cpu", "kind": "cpu", "count": 8}],
    "roles": {"actor_train": {"pool": "train"}, "actor_gen": {"pool": "gen", "workers": 1},
              "environment": {"pool": "cpu", "workers": 1}},
    "tasks": [
        {"tag": "FrozenLake",
         "env": {"name": "frozenlake", "options": {"desc": ["SFF", "FHF", "FFG"],
                                                   "obs_format": "compact"}},
         "reward": {"name": "rule", "options": {"mode": "success"}},
         "max_turns": 4, "constrain_actions": True, "system_prompt": None},
        {"tag": "Arithmetic",
         "env": {"name": "arithmetic", "options": {"num_digits": 1, "ops": ["+"]}},
         "reward": {"name": "rule", "options": {"mode": "exact_match"}},
         "max_turns": 1, "system_prompt": None, "sampling": {"max_new_tokens": 32}},
    ],
    "engine": {"name": "torch", "options": {"max_running": 32}},
    # The sim's trainer costs every token of the samples it runs (FLOPs/token); the torch
    # trainer's prefix tree computes shared prefixes once, which the cost model does not
    # describe: the calibrated run computes every token. skip_zero_advantage is modelled
    # (the sim takes the real trainer's setting) but kept off here: with it on, this run
    # trains almost nothing (rewards are nearly all 0) and the step is the rollout, which
    # the sim overestimates (docs/simulation.md, "Calibration").
    "trainer": {"name": "torch", "options": {"lr": 0.001, "micro_batch_size": 16,
                                             "prefix_sharing": "off",
                                             "skip_zero_advantage": False}},
    "transport": {"name": "local"},
    "rollout": {"batch_size": 16, "group_size": 4, "mode": "sync"},
    "train": {"steps": 5, "bucket_mb": 1, "save_final_model": False},
}


def test_least_squares_recovers_known_costs():
    rows = [[m, m * b, b * (p + m - 1)] for b, p, m in [(1, 8, 24), (4, 8, 24), (12, 8, 24),
                                                       (1, 200, 4), (4, 120, 8)]]
    ys = [0.002 * r[0] + 0.0005 * r[1] + 1e-5 * r[2] for r in rows]
    assert least_squares(rows, ys) == pytest.approx([0.002, 0.0005, 1e-5], rel=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fitted_simulation_predicts_a_real_cpu_run_within_20_percent(tmp_path):
    # The fit and the real run are timed seconds apart on a machine other processes may
    # share: a load change between them moves the comparison, not the model. Each attempt
    # fits and runs afresh; a model that is wrong misses every time.
    results = []
    for attempt in range(3):
        result = calibration_check(REAL, steps=7, out_dir=str(tmp_path / f"a{attempt}"))
        assert len(result["real_step_s"]) == len(result["sim_step_s"]) == 6
        results.append(result)
        if abs(result["error"]) < 0.20:
            break
    assert abs(results[-1]["error"]) < 0.20, [r["error"] for r in results]
