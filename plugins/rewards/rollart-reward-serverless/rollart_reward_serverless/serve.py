"""Serve any installed reward backend as a stateless JSON endpoint.

    python -m rollart_reward_serverless.serve rule --options '{"mode": "success"}' --port 8000

The endpoint takes a RewardRequest as JSON and answers ``{"reward": ..., "details": ...}``:
what reward ``serverless`` calls. Behind a serverless platform (Function Compute, Knative,
Ray Serve) the same function scales to zero between steps (paper R3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from rollart_sdk.cluster.serverless import ServerlessEndpoint, serve_function
from rollart_sdk.plugins import get_registry
from rollart_sdk.types import RewardRequest


def reward_function(name: str, options: dict[str, Any] | None = None, registry: Any = None):
    """A pure function ``RewardRequest-as-dict -> {"reward", "details"}`` for backend ``name``."""
    backend = (registry or get_registry()).get("reward", name).create(options or {})

    def score(request: dict[str, Any]) -> dict[str, Any]:
        result = asyncio.run(backend.score(RewardRequest(**request)))
        return {"reward": result.reward, "details": result.details}

    return score


def serve_reward(name: str, options: dict[str, Any] | None = None, host: str = "127.0.0.1",
                 port: int = 0, registry: Any = None) -> ServerlessEndpoint:
    """Start serving reward backend ``name`` on a thread; ``close()`` stops it."""
    return serve_function(reward_function(name, options, registry), host, port)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="a registered reward backend, e.g. rule")
    p.add_argument("--options", default="{}", help="the backend's options as JSON")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args(argv)
    endpoint = serve_reward(args.name, json.loads(args.options), args.host, args.port)
    print(f"serving reward {args.name!r} at {endpoint.url} (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        endpoint.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
