"""Built-in serverless URL schemes: ``http``, ``https`` and ``fc`` (Function Compute)."""

from __future__ import annotations

from rollart_sdk.hookspecs import hookimpl


@hookimpl
def rollart_register_serverless_schemes(registry):
    for scheme in ("http", "https"):
        registry.register(
            scheme,
            factory="rollart_sdk.serverless.client:HttpJsonCaller",
            summary="POST {args, kwargs} as JSON, answer {result} or {error}",
        )
    registry.register(
        "fc",
        factory="rollart_sdk.serverless.client:fc_caller",
        summary="Alibaba Function Compute HTTP trigger (the same JSON over HTTPS)",
    )
