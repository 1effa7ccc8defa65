"""The engine worker's side of the collective path: RPCs to SGLang's scheduler process.

The scheduler's side is :mod:`rollart_engine_sglang.scheduler`. The adapter sends
``RpcReqInput(method="rollart_...", parameters=...)`` on the ``Engine``'s own RPC socket
(``Engine.send_to_rpc``, a ZMQ DEALER: what ``Engine.collective_rpc`` does, which
discards the answer's message; the scheduler side puts its JSON result there) and reads
the ``RpcReqOutput``. One call at a time; the blocking socket calls run in a thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from rollart_sdk.errors import RollartError

RPC_TIMEOUT_S = 120.0


class SchedulerRpc:
    """``rollart_*`` calls to the scheduler process of an SGLang ``Engine``."""

    def __init__(self, engine: Any, timeout_s: float = RPC_TIMEOUT_S) -> None:
        self._socket: Any = getattr(engine, "send_to_rpc", None)
        self._timeout_ms = int(timeout_s * 1000)
        self._lock = threading.Lock()
        self.broken: str | None = None

    def available(self) -> str | None:
        """None when the scheduler answers ``rollart_ping``; else why not (the plugin's
        ``sglang.srt.plugins`` entry point is not installed, the engine has no RPC
        socket, ...)."""
        if self._socket is None:
            return "the SGLang engine has no RPC socket (send_to_rpc)"
        try:
            self.call("rollart_ping")
        except RollartError as exc:
            return str(exc)
        return None

    def call(self, method: str, **params: bool | int | float | str | None) -> Any:
        """Blocking: send, wait for the answer, return its JSON result (raises
        :class:`RollartError` with the scheduler's error)."""
        from sglang.srt.managers.io_struct import RpcReqInput, sock_recv, sock_send

        if self.broken is not None:
            raise RollartError(f"engine 'sglang': scheduler RPC unusable: {self.broken}")
        with self._lock:
            sock_send(self._socket, RpcReqInput(method=method, parameters=params or None))
            if not self._socket.poll(self._timeout_ms):
                # A late answer would be taken for the next call's: stop using the socket.
                self.broken = (f"{method} got no answer within {self._timeout_ms / 1000} s "
                               "(is the scheduler process alive?)")
                raise RollartError(f"engine 'sglang': {self.broken}")
            out = sock_recv(self._socket)
        if not out.success:
            raise RollartError(f"engine 'sglang': scheduler RPC {method} failed: {out.message}")
        return json.loads(out.message) if out.message else None

    async def acall(self, method: str, **params: bool | int | float | str | None) -> Any:
        return await asyncio.to_thread(self.call, method, **params)
