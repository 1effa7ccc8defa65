"""WeightSync: the driver-side coordinator that moves one policy version onto every engine.

The trainer publishes a version through its transport and hands back a manifest;
``stage(manifest)`` tells every engine worker to start receiving it in the background
(``EngineWorker.stage_weights`` -> :class:`~rollart_sdk.weights.WeightStager`), and
``commit()`` swaps it in on every engine at the protocol's suspend point
(``EngineWorker.commit_weights``). ``status()`` / ``wait_ready()`` tell whether the staged
version has fully arrived everywhere, so that the pipeline can defer the commit while it
has not (the engines keep generating on the old version meanwhile). The request router
(``LLMProxy``) only routes; this object is the weight-sync channel.

Dead engines: with a ``proxy`` (given at construction: the run's LLMProxy, or anything with
its ``down`` map and ``mark_down``: :class:`EngineHealth`), every call goes to the
engines the proxy has not marked down, and an engine whose process dies during a call (or
that was restarted and has not reloaded: ``EngineRestartedError``) is marked down and left
out of that call's answers instead of failing the update. Once Ray restarted it,
EngineRecovery (``rollart_sdk.control.recovery``) loads the version every other engine
serves, under the weight-update lock, before it rejoins: a live engine is never left on
another version than its peers, and a down one catches up before it serves.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from rollart_sdk.types import WeightManifest, WeightUpdateReport

if TYPE_CHECKING:
    from rollart_sdk.cluster.handles import EngineClient, WorkerHandle

T = TypeVar("T")


class EngineHealth(Protocol):
    """Which engines are out of service (the LLMProxy's record): a weight call skips them
    and marks down one that dies during it."""

    @property
    def down(self) -> Mapping[str, str]: ...

    def mark_down(self, name: str, why: str) -> None: ...


def for_reform(manifest: WeightManifest) -> WeightManifest:
    """The staged ``manifest`` as the live engines receive it again after an engine
    counted in its round died (``control/weight_updates.py``): ``meta["reform"]`` (a push
    transport cancels the round in flight) and, like a restarted engine's reload,
    ``meta["reload"]`` with ``meta["receivers"] = 1`` (each survivor receives it alone,
    so no round waits for anyone). A pull transport reads the stored version as always."""
    return dataclasses.replace(manifest, meta={**manifest.meta, "receivers": 1,
                                               "reload": True, "reform": True})


class WeightSync:
    """Stages and commits a version on every live engine worker."""

    def __init__(self, engines: Sequence[WorkerHandle], proxy: EngineHealth | None = None) -> None:
        self.engines = list(engines)
        self.proxy = proxy  # which engines are down (None: every engine is live)

    def live(self) -> list[WorkerHandle]:
        """The engines not marked down."""
        down = self.proxy.down if self.proxy is not None else {}
        return [e for e in self.engines if e.name not in down]

    async def _each(self, call: Callable[[EngineClient], Awaitable[T]]) -> list[T]:
        """``call`` every live engine (through its typed client); one that dies meanwhile
        is marked down and left out of the answers; any other error is raised (the first
        one)."""
        from rollart_sdk.errors import is_worker_death

        live = self.live()
        results = await asyncio.gather(*(call(e.engine) for e in live),
                                       return_exceptions=True)
        out: list[T] = []
        error: BaseException | None = None
        for e, r in zip(live, results, strict=True):
            if not isinstance(r, BaseException):
                out.append(r)
            elif is_worker_death(r) and self.proxy is not None:
                self.proxy.mark_down(e.name, f"{type(r).__name__}: {r}"[:500])
            elif error is None:
                error = r
        if error is not None:
            raise error
        return out

    async def stage(self, manifest: WeightManifest) -> None:
        """Every live engine starts receiving ``manifest``'s buckets; generation continues.

        ``meta["receivers"]`` is set to the live engines now (a push transport's round
        waits for that many; a down engine reloads when it is back), unless each receives
        it alone (``meta["reload"]``: :func:`for_reform`)."""
        if not manifest.meta.get("reload"):
            manifest.meta["receivers"] = len(self.live())
        await self._each(lambda e: e.stage_weights(manifest))

    async def commit(self) -> list[WeightUpdateReport]:
        """Every live engine swaps in the staged version (call it while the proxy is
        suspended). An engine that died is left out (it reloads when restarted).

        Raises the first engine's :class:`~rollart_sdk.weights.WeightSyncError`.
        """
        return await self._each(lambda e: e.commit_weights())

    async def status(self) -> list[dict[str, Any]]:
        """Every live engine's staged transfer: version, ready, error (``weights_status``)."""
        return await self._each(lambda e: e.weights_status())

    async def wait_ready(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Wait until every live engine's staged transfer has finished (arrived or
        failed); nothing is swapped in, generation goes on meanwhile."""
        return await self._each(lambda e: e.await_weights(timeout_s))

    async def cancel(self) -> None:
        """Every live engine drops its staged version and keeps serving the one it has."""
        await self._each(lambda e: e.cancel_weights())

    async def stats(self) -> list[dict[str, Any]]:
        """Every live engine's ``stats()`` (the pipeline reads their KV-recompute seconds)."""
        return await self._each(lambda e: e.stats())
