"""Registers engine ``example``. Imports nothing heavy: the backend loads when selected."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_engines(registry: Registrar) -> None:
    registry.register(
        "example",
        factory="rollart_engine_example.engine:ExampleEngine",
        options="rollart_engine_example.engine:ExampleOptions",
        summary="engine example (rollart new-plugin template)",
    )
