"""``rollart bench turns``: per-turn calls, bytes and CPU in both layouts, one short run
each (no speed thresholds: counts only, which do not depend on the machine's load)."""

from __future__ import annotations

import json

import pytest
from rollart_benchmark_suite.turns import CallMeter

from rollart_sdk.cli import main
from rollart_sdk.cluster.handles import WorkerHandle

pytestmark = pytest.mark.timeout(900)


def test_turns_bench_is_registered(suite_plugins) -> None:
    desc = suite_plugins.registry.get("benchmark", "turns")
    assert desc.factory == "rollart_benchmark_suite.turns:main"


def test_the_meter_counts_calls_and_leaves_the_handle_as_it_was() -> None:
    import asyncio

    class Target:
        async def echo(self, x):
            return x

        async def many(self, xs):
            for x in xs:
                yield [x]

    before = (WorkerHandle.call, WorkerHandle.submit, WorkerHandle.stream)
    meter = CallMeter()
    meter.install()
    try:
        h = WorkerHandle("w", Target(), is_ray=False)

        async def run():
            assert await h.call("echo", 1) == 1
            return [x async for x in h.stream("many", [1, 2, 3])]

        assert asyncio.run(run()) == [[1], [2], [3]]
    finally:
        meter.uninstall()
    assert (WorkerHandle.call, WorkerHandle.submit, WorkerHandle.stream) == before
    counts = meter.to_json()
    assert counts["echo"]["calls"] == 1 and counts["many"]["requests"] == 3
    assert counts["echo"]["arg_bytes"] == 0  # in process nothing is pickled


def test_on_ray_a_wave_of_turns_is_one_call_and_the_engine_steps_as_in_process(tmp_path):
    out = tmp_path / "turns.json"
    assert main(["bench", "turns", "--layouts", "inprocess", "ray", "--steps", "1",
                 "--seed", "1", "--json", str(out)]) == 0
    inproc, ray = json.loads(out.read_text())["rows"]
    assert (inproc["layout"], ray["layout"]) == ("inprocess", "ray")
    # The same run: the same draws and the same turns in both layouts.
    assert inproc["success_per_step"] == ray["success_per_step"]
    turns = inproc["per_turn"]["turns"]
    assert ray["per_turn"]["turns"] == turns > 64
    # One generate_many call per wave (at most 8 turns a step), none per turn; the
    # engine gets each wave at once: as many forward steps as in process.
    assert "generate" not in ray["calls"]
    assert ray["calls"]["generate_many"]["requests"] == turns
    assert ray["calls"]["generate_many"]["calls"] <= 2 * 8
    assert ray["engine"]["steps"] == inproc["engine"]["steps"] <= 8
    # Every Ray call of the run (weights, train step, releases too): well under one a turn.
    assert ray["per_turn"]["ray_calls_per_turn"] < 0.5 and inproc["per_turn"][
        "ray_calls_per_turn"] == 0
    # What crossed the process boundary, and who spent the CPU.
    assert ray["per_turn"]["bytes_per_turn"] > 0 == inproc["per_turn"]["bytes_per_turn"]
    assert any(k.startswith("ray::EngineWorker") for k in ray["workers_cpu_s"])
    assert inproc["workers_cpu_s"] == {} and inproc["driver_cpu_s"] > 0
