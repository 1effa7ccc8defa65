"""Typed clients over a worker handle: how the control plane calls the workers.

``EngineClient(handle).stage_weights(manifest)`` (or ``handle.engine.stage_weights(...)``)
instead of ``handle.call("stage_weights", manifest)``: each method is one line over
:meth:`WorkerHandle.call <rollart_sdk.cluster.handles.WorkerHandle.call>`, named and typed
as the role's Protocol in :mod:`rollart_sdk.cluster.hosts` says, so mypy checks every
call across the boundary and the method names live here only
(``tests/cluster/test_clients.py`` checks each client against its Protocol, and that the
control plane passes no method name as a string).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from rollart_sdk.cluster.hosts import GeneratedBatch, ResetResult, StepResult
from rollart_sdk.cluster.shards import Shard
from rollart_sdk.types import (
    GenerationRequest,
    GenerationResult,
    RewardRequest,
    RewardResult,
    WeightManifest,
    WeightUpdateReport,
)

if TYPE_CHECKING:
    from rollart_sdk.cluster.handles import WorkerHandle
    from rollart_sdk.cluster.hosts import EngineHost, EnvHost, RewardHost, TrainerHost


T = TypeVar("T")


def await_answer(call: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """Run one client call to its answer from driver code outside the event loop
    (building the job, the end-of-run summary and final save):
    ``await_answer(handle.trainer.version(), 60)``. ``TimeoutError`` after ``timeout_s``; the
    worker's own error as it raised it."""
    return asyncio.run(asyncio.wait_for(call, timeout_s))


class _Client:
    __slots__ = ("handle",)

    def __init__(self, handle: WorkerHandle) -> None:
        self.handle = handle

    @property
    def name(self) -> str:
        return self.handle.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.handle!r})"


class EngineClient(_Client):
    """:class:`~rollart_sdk.cluster.hosts.EngineHost` through a handle."""

    __slots__ = ()

    async def generate(self, request: GenerationRequest,
                       kv: list[Any] | None = None) -> GenerationResult:
        """``kv``: ``[the prefill worker's K/V hand-off]`` (:meth:`submit_prefill_kv`)."""
        if kv is None:
            return await self.handle.call("generate", request)
        return await self.handle.call("generate", request, kv)

    def generate_many(self, requests: list[GenerationRequest]) -> AsyncIterator[GeneratedBatch]:
        """Several requests in one call; their results as they finish (one streaming call
        on Ray: :meth:`WorkerHandle.stream`)."""
        return self.handle.stream("generate_many", requests)

    async def prefill_kv(self, request: GenerationRequest, held: int = 0,
                         held_version: int | None = None,
                         kv: list[Any] | None = None) -> Any:
        return await self.handle.call("prefill_kv", request, held, held_version, kv)

    def submit_prefill_kv(self, request: GenerationRequest, held: int = 0,
                          held_version: int | None = None,
                          kv: list[Any] | None = None) -> Any:
        """Start ``prefill_kv`` without waiting: a Ray ObjectRef the decode worker fetches
        from the object store (in-process, an asyncio Task). ``held``/``held_version``:
        what the decode worker already holds; ``kv``: ``[its last answer's K/V]``
        (:meth:`submit_export_kv`)."""
        return self.handle.submit("prefill_kv", request, held, held_version, kv)

    async def export_kv(self, trajectory_id: str, start: int) -> Any:
        return await self.handle.call("export_kv", trajectory_id, start)

    def submit_export_kv(self, trajectory_id: str, start: int) -> Any:
        """Start ``export_kv`` without waiting (the K/V the engine kept for the trajectory
        from ``start`` on), for the next turn's prefill worker to fetch."""
        return self.handle.submit("export_kv", trajectory_id, start)

    async def release(self, trajectory_id: str) -> bool:
        return bool(await self.handle.call("release", trajectory_id))

    async def release_many(self, trajectory_ids: list[str]) -> int:
        return int(await self.handle.call("release_many", trajectory_ids) or 0)

    async def abort(self, request_id: str) -> bool:
        return bool(await self.handle.call("abort", request_id))

    async def suspend(self) -> None:
        await self.handle.call("suspend")

    async def resume(self) -> None:
        await self.handle.call("resume")

    async def stage_weights(self, manifest: WeightManifest) -> None:
        await self.handle.call("stage_weights", manifest)

    async def commit_weights(self) -> WeightUpdateReport:
        return await self.handle.call("commit_weights")

    async def reload(self, manifest: WeightManifest | None,
                     staged: WeightManifest | None = None) -> int:
        return int(await self.handle.call("reload", manifest, staged))

    async def weights_status(self) -> dict[str, Any]:
        return await self.handle.call("weights_status")

    async def await_weights(self, timeout_s: float | None = None) -> dict[str, Any]:
        return await self.handle.call("await_weights", timeout_s)

    async def cancel_weights(self) -> None:
        await self.handle.call("cancel_weights")

    async def version(self) -> int:
        return int(await self.handle.call("version"))

    async def restart_state(self) -> dict[str, Any]:
        return await self.handle.call("restart_state")

    async def stats(self) -> dict[str, Any]:
        return await self.handle.call("stats")

    async def shutdown(self) -> None:
        await self.handle.call("shutdown")


class TrainerClient(_Client):
    """:class:`~rollart_sdk.cluster.hosts.TrainerHost` through a handle (every call awaited)."""

    __slots__ = ()

    async def train_step(self, batch: Shard) -> dict[str, float]:
        """``batch``: the rank's samples, or on Ray a reference to them in the object
        store (:func:`rollart_sdk.cluster.shards.shard_batch`)."""
        return await self.handle.call("train_step", batch)

    async def publish_weights(self, bucket_bytes: int) -> WeightManifest | None:
        return await self.handle.call("publish_weights", bucket_bytes)

    async def release_weights(self, version: int) -> None:
        await self.handle.call("release_weights", version)

    async def version(self) -> int:
        return int(await self.handle.call("version"))

    async def save_checkpoint(self, path: str) -> None:
        await self.handle.call("save_checkpoint", path)

    async def load_checkpoint(self, path: str) -> None:
        await self.handle.call("load_checkpoint", path)

    async def save_pretrained(self, path: str) -> None:
        await self.handle.call("save_pretrained", path)


class EnvClient(_Client):
    """:class:`~rollart_sdk.cluster.hosts.EnvHost` through a handle (every call awaited)."""

    __slots__ = ()

    async def reset(self, env_id: str, tag: str, seed: int,
                    timeout_s: float = 30.0) -> ResetResult:
        return await self.handle.call("reset", env_id, tag, seed, timeout_s)

    async def step(self, env_id: str, action: str, timeout_s: float = 30.0) -> StepResult:
        return await self.handle.call("step", env_id, action, timeout_s)

    async def close(self, env_id: str) -> str | None:
        return await self.handle.call("close", env_id)

    async def stats(self) -> dict[str, Any]:
        return await self.handle.call("stats")

    async def shutdown(self) -> None:
        await self.handle.call("shutdown")


class RewardClient(_Client):
    """:class:`~rollart_sdk.cluster.hosts.RewardHost` through a handle."""

    __slots__ = ()

    async def score(self, tag: str, request: RewardRequest) -> RewardResult:
        return await self.handle.call("score", tag, request)


if TYPE_CHECKING:  # each client is its Protocol, awaited
    _engine: type[EngineHost] = EngineClient
    _trainer: type[TrainerHost] = TrainerClient
    _env: type[EnvHost] = EnvClient
    _reward: type[RewardHost] = RewardClient
