"""Registers env ``example``. Imports nothing heavy: the backend loads when selected."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_envs(registry: Registrar) -> None:
    registry.register(
        "example",
        factory="rollart_env_example.env:ExampleEnv",
        options="rollart_env_example.env:ExampleOptions",
        summary="env example (rollart new-plugin template)",
        traits={"turns": "max_replies (default 3)",
                "character": "multi-turn, short replies"},
    )
