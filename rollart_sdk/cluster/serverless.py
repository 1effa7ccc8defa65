"""Serverless endpoints: the callable behind ``@register_serverless`` (paper R3).

A URL's scheme picks the transport. Built in: ``http`` and ``https`` (JSON over HTTP:
``POST {"args": [...], "kwargs": {...}}`` answered by ``{"result": ...}`` or
``{"error": "..."}``) and ``fc`` (Alibaba Function Compute HTTP triggers, which speak the
same JSON over HTTPS: ``fc://host/path`` -> ``https://host/path``). A plugin adds a scheme
with the entry-point group ``rollart.serverless`` (``myscheme = "pkg.mod:factory"``) or
``register_scheme``; a factory takes ``(url, timeout_s)`` and returns a callable.

``serve_function`` runs a pure function behind such an endpoint (for tests, and for
running a reward function as a local service).
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import entry_points
from typing import Any
from urllib.parse import urlparse

from rollart_sdk.errors import RollartError

ENTRY_POINT_GROUP = "rollart.serverless"

TransportFactory = Callable[[str, float], Callable[..., Any]]


class ServerlessError(RollartError):
    """A serverless endpoint could not be reached or returned an error."""


class HttpJsonTransport:
    """POST the call as JSON and return the decoded ``result``."""

    def __init__(self, url: str, timeout_s: float = 60.0) -> None:
        self.url = url
        self.timeout_s = timeout_s

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            body = json.dumps({"args": list(args), "kwargs": kwargs}).encode()
        except TypeError as exc:
            raise ServerlessError(
                f"arguments for {self.url} must be JSON-serialisable (lists, dicts, str, "
                f"numbers): {exc}"
            ) from None
        req = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise ServerlessError(f"serverless endpoint {self.url} answered HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise ServerlessError(f"serverless endpoint {self.url} unreachable: {exc}") from None
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


def _fc_transport(url: str, timeout_s: float = 60.0) -> HttpJsonTransport:
    p = urlparse(url)
    return HttpJsonTransport(p._replace(scheme="https").geturl(), timeout_s)


_BUILTIN: dict[str, TransportFactory] = {
    "http": HttpJsonTransport,
    "https": HttpJsonTransport,
    "fc": _fc_transport,
}
_REGISTERED: dict[str, TransportFactory] = {}


def register_scheme(scheme: str, factory: TransportFactory) -> None:
    """Add a serverless transport for ``scheme://`` URLs in this process."""
    _REGISTERED[scheme] = factory


def _entry_point_schemes() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def known_schemes() -> set[str]:
    """Every URL scheme a serverless transport is available for."""
    return set(_BUILTIN) | set(_REGISTERED) | set(_entry_point_schemes())


def transport_for(url: str, timeout_s: float = 60.0) -> Callable[..., Any]:
    """The callable that invokes ``url``'s function (scheme chooses the transport)."""
    scheme = urlparse(url).scheme
    factory = _REGISTERED.get(scheme) or _BUILTIN.get(scheme)
    if factory is None:
        ep = _entry_point_schemes().get(scheme)
        if ep is None:
            raise ServerlessError(
                f"no serverless transport for scheme {scheme!r} ({url}); known: "
                f"{', '.join(sorted(known_schemes()))}"
            )
        factory = ep.load()
    return factory(url, timeout_s)


class ServerlessProxy:
    """What ``self.<attribute>`` becomes on a worker: ``proxy(*args)`` calls the endpoint
    and returns its result; ``await proxy.acall(*args)`` does the same without blocking the
    actor's event loop."""

    def __init__(self, url: str, timeout_s: float = 60.0) -> None:
        self.url = url
        self._call = transport_for(url, timeout_s)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._call, *args, **kwargs)

    def __repr__(self) -> str:
        return f"ServerlessProxy({self.url!r})"


class ServerlessEndpoint:
    """A pure function served as a JSON-over-HTTP endpoint on a thread (``with`` closes it)."""

    def __init__(self, fn: Callable[..., Any], host: str = "127.0.0.1", port: int = 0,
                 path: str = "/") -> None:
        self.fn = fn
        self.calls = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                try:
                    req = json.loads(self.rfile.read(length) or b"{}")
                    endpoint.calls += 1
                    out = {"result": endpoint.fn(*req.get("args", []), **req.get("kwargs", {}))}
                    code = 200
                except Exception as exc:  # noqa: BLE001 - reported to the caller
                    out, code = {"error": f"{type(exc).__name__}: {exc}"}, 500
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                return

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}{path}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ServerlessEndpoint:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def serve_function(fn: Callable[..., Any], host: str = "127.0.0.1", port: int = 0) -> ServerlessEndpoint:
    """Serve ``fn`` at ``http://host:port/`` until ``close()``."""
    return ServerlessEndpoint(fn, host, port)
