"""Calling a serverless endpoint: the callable behind ``@register_serverless`` (paper R3).

A URL's scheme picks the caller, a plugin kind like any other (hook
``rollart_register_serverless_schemes``; listed by ``rollart plugins --kind
serverless_scheme``). Built in (``rollart_sdk.default_plugins.serverless``): ``http`` and
``https`` (JSON over HTTP: ``POST {"args": [...], "kwargs": {...}}`` answered by
``{"result": ...}`` or ``{"error": "..."}``) and ``fc`` (Alibaba Function Compute HTTP
triggers, which speak the same JSON over HTTPS: ``fc://host/path`` ->
``https://host/path``). A scheme's factory takes ``(url, timeout_s)`` and returns a
callable. The other side, a function served behind such an endpoint, is
:mod:`rollart_sdk.serverless.server`.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from rollart_sdk.errors import RollartError

CallerFactory = Callable[..., Callable[..., Any]]  # (url, timeout_s[, headers=]) -> caller


class ServerlessError(RollartError):
    """A serverless endpoint could not be reached or returned an error (``status``: the
    HTTP status it answered, if any)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class HttpJsonCaller:
    """POST the call as JSON and return the decoded ``result``."""

    def __init__(self, url: str, timeout_s: float = 60.0,
                 headers: dict[str, str] | None = None) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._headers = dict(headers or {})  # may carry credentials: never logged or shown

    def __repr__(self) -> str:
        return f"HttpJsonCaller({self.url!r}, headers={sorted(self._headers)})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            body = json.dumps({"args": list(args), "kwargs": kwargs}).encode()
        except TypeError as exc:
            raise ServerlessError(
                f"arguments for {self.url} must be JSON-serialisable (lists, dicts, str, "
                f"numbers): {exc}"
            ) from None
        req = urllib.request.Request(
            self.url, data=body, method="POST",
            headers={**self._headers, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise ServerlessError(f"serverless endpoint {self.url} answered HTTP {exc.code}: "
                                  f"{detail}", status=exc.code) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise ServerlessError(f"serverless endpoint {self.url} unreachable: {exc}") from None
        except http.client.HTTPException as exc:  # e.g. the answer cut short (IncompleteRead)
            raise ServerlessError(
                f"serverless endpoint {self.url} broke off its answer: "
                f"{type(exc).__name__}: {exc}") from None
        try:
            payload = json.loads(raw)
        except ValueError:
            raise ServerlessError(
                f"serverless endpoint {self.url} did not answer JSON: {raw[:200]!r}"
            ) from None
        if isinstance(payload, dict) and "error" in payload and "result" not in payload:
            raise ServerlessError(f"serverless function at {self.url} failed: {payload['error']}")
        if isinstance(payload, dict) and "result" in payload:
            return payload["result"]
        return payload


def fc_caller(url: str, timeout_s: float = 60.0,
              headers: dict[str, str] | None = None) -> HttpJsonCaller:
    p = urlparse(url)
    return HttpJsonCaller(p._replace(scheme="https").geturl(), timeout_s, headers)


def caller_for(url: str, timeout_s: float = 60.0,
               headers: dict[str, str] | None = None) -> Callable[..., Any]:
    """The callable that invokes ``url``'s function (its scheme chooses the caller).

    ``headers`` (e.g. credentials) go to callers that take them; a plugin caller that does
    not is given none, and asking for headers there is an error."""
    from rollart_sdk.errors import UnknownBackendError
    from rollart_sdk.plugins import get_registry

    scheme = urlparse(url).scheme
    try:
        desc = get_registry().get("serverless_scheme", scheme)
    except UnknownBackendError as exc:
        raise ServerlessError(f"no serverless caller for {url}: {exc}") from None
    factory: CallerFactory = desc.load()
    if headers:
        try:
            return factory(url, timeout_s, headers=headers)
        except TypeError as exc:
            raise ServerlessError(
                f"the serverless caller for {scheme!r} takes no headers (credentials) "
                f"({exc}); authenticate the way that caller documents"
            ) from None
    return factory(url, timeout_s)


class ServerlessProxy:
    """What ``self.<attribute>`` becomes on a worker: ``proxy(*args)`` calls the endpoint
    and returns its result; ``await proxy.acall(*args)`` does the same without blocking the
    actor's event loop."""

    def __init__(self, url: str, timeout_s: float = 60.0,
                 headers: dict[str, str] | None = None) -> None:
        self.url = url
        self._call = caller_for(url, timeout_s, headers)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._call, *args, **kwargs)

    def __repr__(self) -> str:
        return f"ServerlessProxy({self.url!r})"


