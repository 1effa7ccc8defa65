"""Registers trainer ``example``. Imports nothing heavy: the backend loads when selected."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_trainers(registry: Registrar) -> None:
    registry.register(
        "example",
        factory="rollart_trainer_example.trainer:ExampleTrainer",
        options="rollart_trainer_example.trainer:ExampleOptions",
        summary="trainer example (rollart new-plugin template)",
    )
