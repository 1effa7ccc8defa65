"""Registers reward ``judge``; imports nothing but the SDK's hook marker (cheap)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_rewards(registry: Registrar) -> None:
    registry.register(
        "judge",
        factory="rollart_reward_judge.judge:JudgeReward",
        options="rollart_reward_judge.options:JudgeRewardOptions",
        summary="LLM-as-a-judge: a prompt template, any engine plugin, a yes/no or score parser",
        # a model to serve: a reward worker on the reward pool (an accelerator where there is
        # one), unlike rule / serverless rewards, which run in the control plane's process
        resources={"GPU": 1},
    )
