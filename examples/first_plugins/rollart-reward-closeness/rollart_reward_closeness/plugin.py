"""Registers reward ``closeness``. Imports nothing heavy: the backend loads when selected."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_rewards(registry: Registrar) -> None:
    registry.register(
        "closeness",
        factory="rollart_reward_closeness.reward:ClosenessReward",
        options="rollart_reward_closeness.reward:ClosenessOptions",
        summary="1 when solved, else partial credit for a near last guess",
    )
