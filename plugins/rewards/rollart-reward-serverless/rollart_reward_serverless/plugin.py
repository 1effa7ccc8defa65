"""Registers reward ``serverless``; imports nothing but the SDK's hook marker (cheap)."""

from __future__ import annotations

from typing import Any

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_rewards(registry: Registrar) -> None:
    registry.register(
        "serverless",
        factory="rollart_reward_serverless.reward:ServerlessReward",
        options="rollart_reward_serverless.reward:ServerlessRewardOptions",
        summary="reward computed by a stateless HTTP/JSON endpoint (fc:// and plugin schemes too)",
    )


@hookimpl
def rollart_register_benchmarks(registry: Any) -> None:
    registry.register(
        "reward",
        factory="rollart_reward_serverless.bench:main",
        summary="judge reward on a dedicated worker vs serverless (Ray Serve from zero): "
        "utilisation, step time, exposed reward",
    )
