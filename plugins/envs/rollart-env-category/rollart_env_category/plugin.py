"""Registers env ``category``; imports nothing but the SDK's hook marker (cheap)."""

from __future__ import annotations

from typing import Any

from rollart_sdk.hookspecs import hookimpl


@hookimpl
def rollart_register_envs(registry: Any) -> None:
    registry.register(
        "category",
        factory="rollart_env_category.env:CategoryEnv",
        options="rollart_env_category.env:CategoryOptions",
        summary="name a thing of a category in one word; no answer key (score it with a judge)",
    )
