"""Registers serverless_scheme ``example``. Imports nothing heavy: the backend loads when selected."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_serverless_schemes(registry: Registrar) -> None:
    registry.register(
        "example",
        factory="rollart_serverless_scheme_example.scheme:ExampleCaller",
        options="rollart_serverless_scheme_example.scheme:ExampleOptions",
        summary="serverless_scheme example (rollart new-plugin template)",
    )
