"""Registers env ``sandbox``; imports nothing but the SDK's hook marker (cheap)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl


@hookimpl
def rollart_register_envs(registry):
    registry.register(
        "sandbox",
        factory="rollart_env_sandbox.env:SandboxCodeEnv",
        options="rollart_env_sandbox.env:SandboxOptions",
        summary="SWE-style: fix a tiny Python repo via tool calls; each episode jailed "
                "(netns, rlimits, Landlock); reward = tests pass",
    )
