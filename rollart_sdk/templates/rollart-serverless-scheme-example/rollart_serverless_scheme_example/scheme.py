"""Serverless URL scheme ``example://``: how a worker calls a function at such a URL.

The factory is called as ``ExampleCaller(url, timeout_s)`` and returns a callable; calling it
invokes the remote function and returns its result (raise ``ServerlessError`` on
failure). This template maps ``example://host/path`` to the built-in JSON-over-HTTP caller.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict

from rollart_sdk.serverless import HttpJsonCaller


class ExampleOptions(BaseModel):
    """A scheme is configured by its URL: nothing to set here."""

    model_config = ConfigDict(extra="forbid")


class ExampleCaller:
    def __init__(self, url: str, timeout_s: float = 60.0) -> None:
        http = urlparse(url)._replace(scheme="http").geturl()
        self._call = HttpJsonCaller(http, timeout_s)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)
