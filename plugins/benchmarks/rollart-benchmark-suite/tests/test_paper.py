"""The paper's experiments (benchmark ``paper``, ``rollart sim --experiment NAME``): their
rows on simulated time, and the CLI's two ways to them."""

from __future__ import annotations

import json

import pytest
from rollart_benchmark_suite.paper import EXPERIMENTS, run_experiment

from rollart_sdk.testing.dists import run_cli


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_straggler_experiment_writes_rows_per_sigma(tmp_path):
    out = tmp_path / "s.json"
    lines: list[str] = []
    assert run_experiment("straggler", json_path=str(out), quick=True, out=lines.append) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["sigma_over_mu"] for r in rows] == [0.0, 0.1, 0.5, 1.0]
    speedups = [r["speedup"] for r in rows]
    assert speedups[0] == pytest.approx(1.0, abs=0.01)
    assert speedups == sorted(speedups) and speedups[-1] > 1.3
    assert any("paper" in line for line in lines)


def test_the_reward_experiment_rows(tmp_path):
    lines: list[str] = []
    out = tmp_path / "r3.json"
    assert run_experiment("reward", json_path=str(out), quick=True, out=lines.append) == 0
    rows = {r["deployment"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"dedicated", "serverless"}
    for r in rows.values():
        assert 0 < r["replica_utilisation"] <= 1 and r["exposed_reward_s"] >= 0
        assert r["reward_latency_p50_s"] >= 0.05  # no call is faster than its service
    assert rows["dedicated"]["cold_starts"] == 0 and rows["serverless"]["cold_starts"] >= 1
    assert rows["dedicated"]["instances"] == 8 * rows["dedicated"]["jobs"]
    assert any("simulated" in line for line in lines)


def test_rollart_sim_runs_the_registered_experiments(tmp_path):
    """`rollart sim --list` and `--experiment NAME` go to this package's benchmark
    `paper` (the core has no copy): the same list as `rollart bench paper --list`, the
    rows written where --json says, an unknown name refused with the names."""
    listed = run_cli("sim", "--list")
    assert listed.returncode == 0, listed.stderr
    names = [line.split(":")[0] for line in listed.stdout.splitlines() if ":" in line]
    assert names == list(EXPERIMENTS)
    assert run_cli("bench", "paper", "--list").stdout == listed.stdout
    out = tmp_path / "weights.json"
    res = run_cli("sim", "--experiment", "weight-sync", "--quick", "--json", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    data = json.loads(out.read_text())
    assert data["experiment"] == "weight-sync" and data["quick"] is True
    assert {r["transport"] for r in data["rows"]} >= {"push"}
    bad = run_cli("sim", "--experiment", "straggle")
    assert bad.returncode == 2
    assert "unknown experiment 'straggle'" in bad.stderr and "straggler" in bad.stderr
