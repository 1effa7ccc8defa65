"""A pure function served behind a serverless endpoint (the JSON over HTTP that
:mod:`rollart_sdk.serverless.client` calls), for tests and for running a reward function
as a local service.

``serve_function`` runs it on a thread. With a ``token`` it answers only requests
carrying ``Authorization: Bearer <token>``; bodies are JSON only and size-limited, and an
error answer never carries the exception's text (it is logged on the server with an id the
answer gives). A caller that gave up (its timeout) and closed the connection before the
answer is counted (``disconnected``) and logged at debug level: no traceback, and the
server goes on serving.
"""

from __future__ import annotations

import hmac
import json
import logging
import sys
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY_BYTES = 1 << 20  # a request body larger than this is refused (413)

log = logging.getLogger(__name__)


class ServerlessEndpoint:
    """A pure function served as a JSON-over-HTTP endpoint on a thread (``with`` closes it).

    ``token``: when set, a request without ``Authorization: Bearer <token>`` gets 401.
    Bodies must be ``application/json`` (415 otherwise) of at most ``max_body_bytes``
    (413). A function that raises answers 500 with an error id; the exception is logged
    here under that id, never sent to the caller. A caller gone before its answer was
    written (it timed out and closed the connection) is counted in ``disconnected``.
    """

    def __init__(self, fn: Callable[..., Any], host: str = "127.0.0.1", port: int = 0,
                 path: str = "/", token: str | None = None,
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.fn = fn
        self.calls = 0
        self.rejected = 0
        self.disconnected = 0  # callers that closed the connection before their answer
        endpoint = self
        expected = f"Bearer {token}".encode() if token else None

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's naming
                code, out = endpoint._handle(self.headers, self.rfile, expected, max_body_bytes)
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                return

        self.server = _QuietServer((host, port), Handler, endpoint)
        self.server.daemon_threads = True
        self.url = f"http://{_url_host(host)}:{self.server.server_address[1]}{path}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _handle(self, headers: Any, rfile: Any, expected: bytes | None,
                limit: int) -> tuple[int, dict[str, Any]]:
        given = (headers.get("Authorization") or "").encode()
        if expected is not None and not hmac.compare_digest(given, expected):
            self.rejected += 1
            return 401, {"error": "unauthorized: send Authorization: Bearer <token>"}
        if (headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
            self.rejected += 1
            return 415, {"error": "the body must be application/json"}
        try:
            length = int(headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= limit:
            self.rejected += 1
            return 413, {"error": f"the body must be at most {limit} bytes"}
        try:
            req = json.loads(rfile.read(length) or b"{}")
            args, kwargs = list(req.get("args", [])), dict(req.get("kwargs", {}))
        except (ValueError, AttributeError, TypeError):
            self.rejected += 1
            return 400, {"error": 'the body must be {"args": [...], "kwargs": {...}}'}
        self.calls += 1
        try:
            return 200, {"result": self.fn(*args, **kwargs)}
        except Exception:  # logged with an id; the caller sees only the id
            error_id = uuid.uuid4().hex[:12]
            log.exception("serverless function failed (error id %s)", error_id)
            return 500, {"error": f"the function failed (error id {error_id}; see the server log)"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ServerlessEndpoint:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _QuietServer(ThreadingHTTPServer):
    """A client that disconnected (reset or closed before the answer: a caller that timed
    out) is counted on the endpoint and logged at debug level; socketserver would print a
    traceback to stderr for it. Any other error keeps socketserver's report."""

    def __init__(self, address: tuple[str, int], handler: Any,
                 endpoint: ServerlessEndpoint) -> None:
        super().__init__(address, handler)
        self.endpoint = endpoint

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):  # BrokenPipe, ConnectionReset/Aborted
            self.endpoint.disconnected += 1
            log.debug("serverless client %s disconnected before its answer: %s",
                      client_address, exc)
            return
        super().handle_error(request, client_address)


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def serve_function(fn: Callable[..., Any], host: str = "127.0.0.1", port: int = 0,
                   token: str | None = None) -> ServerlessEndpoint:
    """Serve ``fn`` at ``http://host:port/`` until ``close()`` (``token``: bearer auth)."""
    return ServerlessEndpoint(fn, host, port, token=token)
