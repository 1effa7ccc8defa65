"""Registers reward ``rule``; imports nothing but the SDK's hook marker (cheap)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_rewards(registry: Registrar) -> None:
    registry.register(
        "rule",
        factory="rollart_reward_rule.reward:RuleReward",
        options="rollart_reward_rule.reward:RuleRewardOptions",
        summary="rule reward: env return, exact match with info['answer'], regex, or success",
    )
