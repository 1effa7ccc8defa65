"""How the driver calls a role worker, in-process or as a Ray actor: the worker handle
and the typed clients over it.

The control plane is asyncio code; it awaits a worker's method through the handle and does
not care whether the worker is a Ray actor on another node (production) or an object in
this process (``layout: inprocess``, unit tests). Ray ObjectRefs are awaitable; in-process
blocking methods run in a thread so they never stall the event loop (or, ``inline``, on
the loop: a run on virtual time, whose clock a thread would stop); an in-process method
that returns an awaitable (a trainer rank hosting a simulated trainer) is awaited.

A worker given an ``executor`` (the local spawner gives each worker that is not
concurrent its own single thread) runs its blocking methods there, one at a time, as a
Ray actor runs them on its one thread. It matters for torch: a train step that lands on
whichever pool thread is free touches another thread's malloc arena and OpenMP team each
step (SmolLM2 in process: the train step went from 3.5 to 8 s after three steps, 10 GB
resident, a third of the CPU time in the kernel; docs/benchmarks.md).

Callers use the typed clients, one per role: ``await handle.engine.generate(request)``,
``handle.trainer``, ``handle.env``, ``handle.reward`` (:class:`EngineClient`,
:class:`TrainerClient`, :class:`EnvClient`, :class:`RewardClient`), instead of
``handle.call("stage_weights", manifest)``: each client method is one line over
:meth:`WorkerHandle.call`, named and typed as the role's Protocol in
:mod:`rollart_sdk.cluster.hosts` says, so mypy checks every call across the boundary and
the method names live here only (``tests/cluster/test_clients.py`` checks each client
against its Protocol, and that the driver passes no method name as a string). Driver code
outside the event loop runs one call to its answer with :func:`await_answer`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import Executor
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


class WorkerHandle:
    """A named worker on a pool: ``await handle.call(method, *args)``."""

    def __init__(self, name: str, target: Any, pool: str = "local", hardware: str = "cpu",
                 is_ray: bool | None = None, inline: bool = False,
                 executor: Executor | None = None) -> None:
        """``inline``: call an in-process target's blocking methods directly on the event
        loop (for methods that take microseconds: a thread hop would cost more).
        ``executor``: run them there (the worker's own thread), else on the loop's
        default executor."""
        self.name = name
        self.inline = inline
        self.executor = executor
        self.target = target
        self.pool = pool
        self.hardware = hardware
        if is_ray is None:
            is_ray = type(target).__name__ == "ActorHandle"
        self.is_ray = is_ray

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.is_ray:
            return await getattr(self.target, method).remote(*args, **kwargs)
        fn = getattr(self.target, method)
        if inspect.iscoroutinefunction(fn):
            return await fn(*args, **kwargs)
        if self.inline:
            result = fn(*args, **kwargs)
        elif self.executor is not None:
            ctx = contextvars.copy_context()
            result = await asyncio.get_running_loop().run_in_executor(
                self.executor, functools.partial(ctx.run, fn, *args, **kwargs))
        else:
            result = await asyncio.to_thread(fn, *args, **kwargs)
        if inspect.isawaitable(result):  # a plain method that hands back work to await
            result = await result
        return result

    async def stream(self, method: str, *args: Any) -> AsyncIterator[Any]:
        """Call a worker method that is an async generator and yield its items as they
        come: on Ray one streaming call (``num_returns="streaming"``: each item comes back
        as the worker yields it, not when the call ends), in process the generator."""
        if self.is_ray:
            refs = getattr(self.target, method).options(num_returns="streaming").remote(*args)
            async for ref in refs:
                yield await ref
            return
        async for item in getattr(self.target, method)(*args):
            yield item

    def submit(self, method: str, *args: Any) -> Any:
        """Start a call without waiting for it: a Ray ObjectRef (pass it as an argument to
        another actor and the result goes through the object store, never through this
        process) or, in-process, an asyncio Task."""
        if self.is_ray:
            return getattr(self.target, method).remote(*args)
        return asyncio.ensure_future(self.call(method, *args))

    @property
    def engine(self) -> EngineClient:
        """This worker as an inference engine's (:class:`~rollart_sdk.cluster.hosts.EngineHost`)."""
        return EngineClient(self)

    @property
    def trainer(self) -> TrainerClient:
        """This worker as a trainer rank's (:class:`~rollart_sdk.cluster.hosts.TrainerHost`)."""
        return TrainerClient(self)

    @property
    def env(self) -> EnvClient:
        """This worker as an env host (:class:`~rollart_sdk.cluster.hosts.EnvHost`)."""
        return EnvClient(self)

    @property
    def reward(self) -> RewardClient:
        """This worker as a reward host (:class:`~rollart_sdk.cluster.hosts.RewardHost`)."""
        return RewardClient(self)

    def __repr__(self) -> str:
        return f"WorkerHandle({self.name!r}, pool={self.pool!r}, ray={self.is_ray})"


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

    async def can_accumulate(self) -> bool:
        return bool(await self.handle.call("can_accumulate"))

    async def accumulate(self, batch: Shard) -> None:
        """Part of the next step's batch (whole groups): forward and backward now, the
        optimiser step with the next ``train_step``."""
        await self.handle.call("accumulate", batch)

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
    from rollart_sdk.cluster.hosts import EngineHost, EnvHost, RewardHost, TrainerHost

    _engine: type[EngineHost] = EngineClient
    _trainer: type[TrainerHost] = TrainerClient
    _env: type[EnvHost] = EnvClient
    _reward: type[RewardHost] = RewardClient
