"""Registers env ``frozenlake``; imports nothing but the SDK's hook marker (cheap)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_envs(registry: Registrar) -> None:
    registry.register(
        "frozenlake",
        factory="rollart_env_frozenlake.env:FrozenLakeTextEnv",
        options="rollart_env_frozenlake.env:FrozenLakeOptions",
        summary="gymnasium FrozenLake: text grid observations, actions Left/Down/Right/Up",
        traits={"turns": "max_steps (default 5 x the map side)",
                "character": "multi-turn, prefill-heavy (the grid is re-read every turn), one-token actions"},
    )
