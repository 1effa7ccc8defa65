"""Built-in envs: ``agent`` (an agent function behind the OpenAI-compatible gateway)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl


@hookimpl
def rollart_register_envs(registry):
    registry.register(
        "agent",
        factory="rollart_sdk.gateway.agent:ImportedAgent",
        options="rollart_sdk.gateway.agent:ImportedAgentOptions",
        summary="an agent written against the OpenAI API: async def run(client, task), "
                "served by the gateway (docs/gateway.md)",
        traits={"turns": "the agent's requests (tasks[].max_turns at most)",
                "character": "an agent program: it drives the model over HTTP; every model "
                             "call is trained (each segment of its history a sample)"},
    )
