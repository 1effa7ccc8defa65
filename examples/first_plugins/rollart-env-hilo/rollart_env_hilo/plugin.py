"""Registers env ``hilo``. Imports nothing heavy: the backend loads when selected."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_envs(registry: Registrar) -> None:
    registry.register(
        "hilo",
        factory="rollart_env_hilo.env:HiloEnv",
        options="rollart_env_hilo.env:HiloOptions",
        summary="guess a digit; the env answers higher / lower",
        traits={"turns": "max_guesses (default 4)",
                "character": "multi-turn, one-token replies, feedback decides the next guess"},
    )
