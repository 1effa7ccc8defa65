"""Registers env ``sokoban``; imports nothing but the SDK's hook marker (cheap)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_envs(registry: Registrar) -> None:
    registry.register(
        "sokoban",
        factory="rollart_env_sokoban.env:SokobanTextEnv",
        options="rollart_env_sokoban.env:SokobanOptions",
        summary="Sokoban: text grid, fixed or generated (seeded) levels, actions Up/Down/Left/Right",
        traits={"turns": "max_steps (default 20)",
                "character": "multi-turn, prefill-heavy (the grid is re-read every turn), one-token actions"},
    )
