"""Registers benchmark ``example``. Imports nothing heavy: the backend loads when selected."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_benchmarks(registry: Registrar) -> None:
    registry.register(
        "example",
        factory="rollart_benchmark_example.bench:ExampleBench",
        options="rollart_benchmark_example.bench:ExampleOptions",
        summary="benchmark example (rollart new-plugin template)",
    )
