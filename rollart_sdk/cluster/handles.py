"""One way for the control plane to call a role worker, in-process or as a Ray actor.

The control plane is asyncio code; it awaits a worker's method through the handle and does
not care whether the worker is a Ray actor on another node (production) or an object in
this process (unit tests of the protocol). Ray ObjectRefs are awaitable; in-process
blocking methods run in a thread so they never stall the event loop (or, ``inline``, on
the loop: a run on virtual time, whose clock a thread would stop); an in-process method
that returns an awaitable (a trainer rank hosting a simulated trainer) is awaited.

Callers use the typed clients (:mod:`rollart_sdk.cluster.clients`), one per role:
``await handle.engine.generate(request)``, ``handle.trainer``, ``handle.env``,
``handle.reward``; :meth:`WorkerHandle.call` with a method name is what those clients are
made of.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import Any

from rollart_sdk.cluster.clients import EngineClient, EnvClient, RewardClient, TrainerClient


class WorkerHandle:
    """A named worker on a pool: ``await handle.call(method, *args)``."""

    def __init__(self, name: str, target: Any, pool: str = "local", hardware: str = "cpu",
                 is_ray: bool | None = None, inline: bool = False) -> None:
        """``inline``: call an in-process target's blocking methods directly on the event
        loop (for methods that take microseconds: a thread hop would cost more)."""
        self.name = name
        self.inline = inline
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
        result = fn(*args, **kwargs) if self.inline else await asyncio.to_thread(
            fn, *args, **kwargs)
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
