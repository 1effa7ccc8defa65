"""Registers transport ``example``. Imports nothing heavy: the backend loads when selected."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_transports(registry: Registrar) -> None:
    registry.register(
        "example",
        factory="rollart_transport_example.transport:ExampleTransport",
        options="rollart_transport_example.transport:ExampleOptions",
        summary="transport example (rollart new-plugin template)",
        process_local=True,
    )
