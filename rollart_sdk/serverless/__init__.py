"""Serverless serving, in one package (paper R3): calling a function by URL, serving one,
and deploying a reward backend behind such a URL on Ray Serve.

- :mod:`~rollart_sdk.serverless.client`: the callable a ``@register_serverless``
  attribute becomes (``ServerlessProxy``), the caller a URL's scheme picks
  (``caller_for``; built in: ``http``, ``https``, ``fc``), ``ServerlessError``;
- :mod:`~rollart_sdk.serverless.server`: a pure function served as a JSON-over-HTTP
  endpoint on a thread (``serve_function``: tests, a reward function as a local service);
- :mod:`~rollart_sdk.serverless.deploy`: any registered reward backend deployed as a Ray
  Serve application that scales from zero (``deploy``, ``DeployOptions``,
  ``ReplicaMonitor``, ``check_exposure``); used by ``rollart serve-reward`` and reward
  ``serverless`` with ``deploy:``;
- :mod:`~rollart_sdk.serverless.replica_log`: each reward replica's own record of its
  reserved and busy time (``read_usage``).

Importing this package imports neither Ray nor pydantic (``deploy`` does).
"""

from __future__ import annotations

from rollart_sdk.serverless.client import (
    HttpJsonCaller,
    ServerlessError,
    ServerlessProxy,
    caller_for,
    fc_caller,
)
from rollart_sdk.serverless.server import MAX_BODY_BYTES, ServerlessEndpoint, serve_function

__all__ = [
    "MAX_BODY_BYTES", "HttpJsonCaller", "ServerlessEndpoint", "ServerlessError",
    "ServerlessProxy", "caller_for", "fc_caller", "serve_function",
]
