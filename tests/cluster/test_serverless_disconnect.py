"""A caller of a ServerlessEndpoint that gives up (its timeout) and closes the connection
before the answer: the server counts it, prints no traceback, and serves the next call.
Real sockets on 127.0.0.1: the client resets the connection (SO_LINGER 0) while the
function is still running, so writing the answer fails the way it does for a real
caller that timed out."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from rollart_sdk.serverless import ServerlessEndpoint, caller_for

pytestmark = pytest.mark.timeout(120)


def test_a_client_that_closes_early_leaves_no_traceback_and_the_next_call_is_served(capfd):
    started, release = threading.Event(), threading.Event()

    def fn(x):
        if x == "slow":
            started.set()
            release.wait(30)
        return {"echo": x}

    with ServerlessEndpoint(fn) as endpoint:
        host, port = endpoint.server.server_address[:2]
        body = b'{"args": ["slow"], "kwargs": {}}'
        sock = socket.create_connection((host, port), timeout=10)
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert started.wait(30), "the function was never called"
        # Gone before the answer: a reset, so the server's write fails at once.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        release.set()
        deadline = time.monotonic() + 30
        while endpoint.disconnected == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert endpoint.disconnected == 1
        # The server goes on serving.
        assert caller_for(endpoint.url, timeout_s=10)("next") == {"echo": "next"}
        assert endpoint.calls == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err and "ConnectionReset" not in err, err
