"""Serve any installed reward backend as a stateless JSON endpoint.

    export ROLLART_REWARD_TOKEN=$(openssl rand -hex 16)
    python -m rollart_reward_serverless.serve rule --options '{"mode": "success"}' --port 8000

The endpoint takes a RewardRequest as JSON and answers ``{"reward": ..., "details": ...}``:
what reward ``serverless`` calls (give it ``token_env: ROLLART_REWARD_TOKEN``). It answers
only callers with ``Authorization: Bearer $ROLLART_REWARD_TOKEN``; ``--insecure`` serves
without a token, on a loopback address only. A non-loopback ``--host`` is served with a
warning. For scale-to-zero and autoscaling use ``rollart serve-reward`` (Ray Serve).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rollart_sdk.plugins import get_registry
from rollart_sdk.serverless import ServerlessEndpoint, serve_function
from rollart_sdk.serverless.deploy import TOKEN_ENV, check_exposure
from rollart_sdk.types import RewardRequest


class _Loop:
    """One event loop on a thread: every request's ``score`` runs there, so a backend that
    keeps loop-bound state (an engine, a client session) works, and concurrent requests
    meet in one place (a judge engine batches them)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="reward-loop", daemon=True).start()

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        """``coro``'s result; past ``timeout`` seconds it is cancelled and TimeoutError
        raised (a hung backend holds no server thread and no coroutine for good)."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"the reward backend did not answer within {timeout:g} s "
                               "(--timeout-s)") from None


def reward_function(name: str, options: dict[str, Any] | None = None, registry: Any = None,
                    timeout_s: float | None = 300.0) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A pure function ``RewardRequest-as-dict -> {"reward", "details"}`` for backend
    ``name``; a call past ``timeout_s`` is cancelled and fails (the caller sees a 500)."""
    backend = (registry or get_registry()).get("reward", name).create(options or {})
    loop = _Loop()

    def score(request: dict[str, Any]) -> dict[str, Any]:
        result = loop.run(backend.score(RewardRequest(**request)), timeout_s)
        return {"reward": result.reward, "details": result.details}

    score.backend = backend  # type: ignore[attr-defined]  # for stats and close
    return score


def serve_reward(name: str, options: dict[str, Any] | None = None, host: str = "127.0.0.1",
                 port: int = 0, registry: Any = None, token: str | None = None,
                 timeout_s: float | None = 300.0) -> ServerlessEndpoint:
    """Start serving reward backend ``name`` on a thread; ``close()`` stops it."""
    return serve_function(reward_function(name, options, registry, timeout_s), host, port,
                          token=token)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="a registered reward backend, e.g. rule")
    p.add_argument("--options", default="{}", help="the backend's options as JSON")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--token-env", default=TOKEN_ENV,
                   help=f"environment variable holding the bearer token (default {TOKEN_ENV})")
    p.add_argument("--insecure", action="store_true",
                   help="serve without a token (loopback addresses only)")
    p.add_argument("--timeout-s", type=float, default=300.0,
                   help="a call whose score takes longer is cancelled and answered 500")
    args = p.parse_args(argv)
    token = os.environ.get(args.token_env) or None
    if args.insecure:
        token = None
    for warning in check_exposure(args.host, token, args.insecure):
        print(warning, file=sys.stderr, flush=True)
    endpoint = serve_reward(args.name, json.loads(args.options), args.host, args.port,
                            token=token, timeout_s=args.timeout_s)
    auth = "bearer token required" if token else "NO authentication (--insecure)"
    print(f"serving reward {args.name!r} at {endpoint.url} ({auth}; Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        endpoint.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
