"""Registers env ``sandbox``; imports nothing but the SDK's hook marker (cheap)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl
from rollart_sdk.registry import Registrar


@hookimpl
def rollart_register_envs(registry: Registrar) -> None:
    registry.register(
        "sandbox",
        factory="rollart_env_sandbox.env:SandboxCodeEnv",
        options="rollart_env_sandbox.env:SandboxOptions",
        summary="SWE-style: fix a tiny Python repo via tool calls; each episode jailed "
                "(netns, rlimits, Landlock); reward = tests pass",
        traits={"turns": "max_tool_calls tool calls (default 12)",
                "character": "multi-turn, prefill-heavy (files and test output pile up); "
                             "env-heavy (each test run is a jailed process)"},
    )
