"""Registers placement ``example``. Imports nothing heavy: the backend loads when selected."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_placements(registry: Registrar) -> None:
    registry.register(
        "example",
        factory="rollart_placement_example.placement:ExamplePlacement",
        options="rollart_placement_example.placement:ExampleOptions",
        summary="placement example (rollart new-plugin template)",
    )
