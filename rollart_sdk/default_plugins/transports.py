"""Built-in weight transports: ``local`` (publish/pull inside one process)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl


@hookimpl
def rollart_register_transports(registry):
    registry.register(
        "local",
        factory="rollart_sdk.weights.local:LocalTransport",
        options="rollart_sdk.weights.local:LocalTransportOptions",
        summary="publish/pull inside one process (in-process runs and tests)",
        process_local=True,
    )
