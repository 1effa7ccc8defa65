"""Registers reward ``example``. Imports nothing heavy: the backend loads when selected."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_rewards(registry: Registrar) -> None:
    registry.register(
        "example",
        factory="rollart_reward_example.reward:ExampleReward",
        options="rollart_reward_example.reward:ExampleOptions",
        summary="reward example (rollart new-plugin template)",
    )
