"""Registers the SDK's benchmarks (``rollart bench NAME``) and the env they run
(``bench-frozenlake``). Imports nothing heavy: a benchmark's module loads when it runs."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_benchmarks(registry: Registrar) -> None:
    registry.register(
        "dispatch",
        factory="rollart_benchmark_suite.dispatch:main",
        summary="Cluster call overhead vs a raw Ray actor call",
    )
    registry.register(
        "straggler",
        factory="rollart_benchmark_suite.straggler:main",
        summary="trajectory-level vs batched env interaction under env latency",
    )
    registry.register(
        "soak",
        factory="rollart_benchmark_suite.soak:main",
        summary="the quickstart loop for N minutes under injected faults: driver RSS growth "
                "after warm-up, accounting",
    )
    registry.register(
        "weights",
        factory="rollart_benchmark_suite.weights:main",
        summary="weight transports on the real pipeline: transfer, exposed, hidden fraction",
    )
    registry.register(
        "async",
        factory="rollart_benchmark_suite.async_modes:main",
        summary="Sync (batched), Sync+, one_off, async alpha 0/1/2 at equal capacity: "
                "step time, waste, length bias, staleness, bound_speedup",
    )
    registry.register(
        "calibration",
        factory="rollart_benchmark_suite.calibration:main",
        summary="the simulator's cost model fitted here against a real CPU run: median "
                "step-time error over repeats (target within 20 %)",
    )
    registry.register(
        "small",
        factory="rollart_benchmark_suite.small:main",
        summary="issue 12 workload: multi-turn FrozenLake GRPO to success 0.7, sync and "
                "async, with and without env latency, vs the synchronous reference",
    )
    registry.register(
        "driver",
        factory="rollart_benchmark_suite.driver:main",
        summary="the driver's CPU time per trajectory and its memory: a batch to 2 ranks "
                "as call arguments vs object references, and the sim at 256-2048 in flight",
    )
    registry.register(
        "turns",
        factory="rollart_benchmark_suite.turns:main",
        summary="one turn of a multi-turn episode, in process and on Ray: worker calls, "
                "bytes pickled and CPU seconds per turn (driver, each worker, Ray)",
    )
    registry.register(
        "paper",
        factory="rollart_benchmark_suite.paper:main",
        summary="a figure of the paper on simulated time (the same as rollart sim "
                "--experiment NAME; --list): the real control plane at paper scale",
    )
    registry.register(
        "gateway",
        factory="rollart_benchmark_suite.gateway:main",
        summary="the OpenAI-compatible gateway vs direct LLMProxy calls, same engine and "
                "prompts: added latency per call (p50, p99) and requests/s",
    )


@hookimpl
def rollart_register_envs(registry: Registrar) -> None:
    # `rollart bench small`'s env, registered here (not by the bench alone) so that
    # `rollart train` finds it: `rollart bench small --path train` runs the real CLI.
    registry.register(
        "bench-frozenlake",
        factory="rollart_benchmark_suite.latency_env:LatencyFrozenLake",
        options="rollart_benchmark_suite.small:LatencyFrozenLakeOptions",
        summary="benchmark env (rollart bench small): FrozenLake whose steps sleep "
                "N(mu, sigma); needs the frozenlake plugin",
        traits={"turns": "max_turns (the workload: 8)",
                "character": "multi-turn, short observations; benchmark only",
                "benchmark": True},  # not offered in "did you mean" / installed-names lists
    )
