"""WeightSync: the driver-side coordinator that moves one policy version onto every engine.

The trainer publishes a version through its transport and hands back a manifest;
``stage(manifest)`` tells every engine worker to start receiving it in the background
(``EngineWorker.stage_weights`` -> :class:`~rollart_sdk.weights.WeightStager`), and
``commit()`` swaps it in on every engine at the protocol's suspend point
(``EngineWorker.commit_weights``). ``status()`` / ``wait_ready()`` tell whether the staged
version has fully arrived everywhere, so that the pipeline can defer the commit while it
has not (the engines keep generating on the old version meanwhile). The request router (``LLMProxy``) only routes; this
object is the weight-sync channel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rollart_sdk.types import WeightManifest, WeightUpdateReport

if TYPE_CHECKING:
    from rollart_sdk.control.handles import WorkerHandle


class WeightSync:
    """Stages and commits a version on every engine worker."""

    def __init__(self, engines: Sequence[WorkerHandle]) -> None:
        self.engines = list(engines)

    async def stage(self, manifest: WeightManifest) -> None:
        """Every engine starts receiving ``manifest``'s buckets; generation continues."""
        await asyncio.gather(*(e.call("stage_weights", manifest) for e in self.engines))

    async def commit(self) -> list[WeightUpdateReport]:
        """Every engine swaps in the staged version (call it while the proxy is suspended).

        Raises the first engine's :class:`~rollart_sdk.weights.WeightSyncError`.
        """
        return list(await asyncio.gather(*(e.call("commit_weights") for e in self.engines)))

    async def status(self) -> list[dict[str, Any]]:
        """Every engine's staged transfer: version, ready, error (``weights_status``)."""
        return list(await asyncio.gather(*(e.call("weights_status") for e in self.engines)))

    async def wait_ready(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Wait until every engine's staged transfer has finished (arrived or failed);
        nothing is swapped in, generation goes on meanwhile."""
        return list(await asyncio.gather(
            *(e.call("await_weights", timeout_s) for e in self.engines)))

    async def cancel(self) -> None:
        """Every engine drops its staged version and keeps serving the one it has."""
        await asyncio.gather(*(e.call("cancel_weights") for e in self.engines))

    async def stats(self) -> list[dict[str, Any]]:
        """Every engine's ``stats()`` (the pipeline reads their KV-recompute seconds)."""
        return list(await asyncio.gather(*(e.call("stats") for e in self.engines)))
