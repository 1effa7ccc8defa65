"""Moved to :mod:`rollart_sdk.serverless` (``client``: calling an endpoint; ``server``:
serving a function); this path re-exports it for one release (CHANGELOG.md)."""

from rollart_sdk.resources.decorators import known_schemes
from rollart_sdk.serverless.client import (
    CallerFactory,
    HttpJsonCaller,
    ServerlessError,
    ServerlessProxy,
    caller_for,
    fc_caller,
)
from rollart_sdk.serverless.server import MAX_BODY_BYTES, ServerlessEndpoint, serve_function

__all__ = [
    "MAX_BODY_BYTES", "CallerFactory", "HttpJsonCaller", "ServerlessEndpoint",
    "ServerlessError", "ServerlessProxy", "caller_for", "fc_caller", "known_schemes",
    "serve_function",
]
