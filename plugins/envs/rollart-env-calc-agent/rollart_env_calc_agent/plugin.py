"""Registers env ``calc_agent``; imports nothing but the SDK's hook marker (cheap)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl

INSTALL = ("pip install -c constraints.txt 'openai-agents==0.24.0' (or bash "
           "scripts/install.sh --dev, or pip install 'rollart-env-calc-agent[sdk]')")


@hookimpl
def rollart_register_envs(registry):
    registry.register(
        "calc_agent",
        factory="rollart_env_calc_agent.env:CalcAgentEnv",
        options="rollart_env_calc_agent.env:CalcAgentOptions",
        summary="an OpenAI Agents SDK agent with a calculator tool answers an arithmetic "
                "question; reward 1 when its final number is right (docs/gateway.md)",
        traits={"turns": "the agent's requests (tasks[].max_turns at most)",
                "character": "an agent program (the Agents SDK, unmodified) behind the "
                             "gateway; tool calls parsed from the model's text"},
        requires={"agents": INSTALL},
    )
