"""``rollart bench driver`` at tiny sizes: what each part runs (no speed thresholds)."""

from __future__ import annotations

import json

import pytest
from rollart_benchmark_suite.driver import sim_once

from rollart_sdk.cli import main

pytestmark = pytest.mark.timeout(600)


def test_driver_bench_is_registered(suite_plugins):
    desc = suite_plugins.registry.get("benchmark", "driver")
    assert desc.factory == "rollart_benchmark_suite.driver:main"


def test_send_part_compares_arguments_with_references(tmp_path):
    out = tmp_path / "rows.json"
    assert main(["bench", "driver", "--parts", "send", "--sizes", "16", "--tokens", "64",
                 "--repeats", "1", "--json", str(out)]) == 0
    rows = {r["mode"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"args", "refs"}
    assert all(r["trajectories"] == 16 and r["cpu_s"] > 0 for r in rows.values())
    # Before: every token in the call's argument (8 ranks' worth of 64 x 4 numbers);
    # now: a reference and five numbers.
    assert rows["args"]["arg_bytes"] > 8 * 64 * 4 and rows["refs"]["arg_bytes"] < 1_000


def test_inflight_part_keeps_that_many_trajectories_in_flight(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    res = sim_once(256, steps=1)
    assert res["in_flight_max"] == 256  # max_envs: the scheduler kept them all busy
    assert res["launched"] >= 256 and res["trained"] >= 128 and res["cpu_s"] > 0
    # The collector's passes, per generation, counted while the run ran; its seconds are
    # a part of the run's CPU seconds (the split the bench reports), never more.
    assert res["gc_passes"][0] > 0 and len(res["gc_s"]) == 3
    assert sum(res["gc_s"]) <= res["cpu_s"]
    # The generation calls it served (the per-turn figure's divisor): every trained
    # trajectory had at least one turn, and the multi-turn tasks more.
    assert res["turns"] > res["trained"]


def test_floor_runs_its_trajectories_to_the_end_with_that_many_in_flight():
    from rollart_benchmark_suite.driver import _floor_row, floor_once

    res = floor_once(64, turns=3)
    # 2.5 x 64 trajectories launched, each through its 3 turns (an engine and an env call
    # each, answered by the stand-in workers): none lost, none cut short.
    assert res["launched"] == 160 and res["turns"] == 160 * 3
    row = _floor_row(64, [res, res])
    assert row["part"] == "floor" and row["cpu_us_per_turn_runs"] == [row["cpu_us_per_turn"]] * 2
