"""The turns that reach one engine worker together go to it in one call.

On Ray every ``generate`` is an actor call: the driver pays a task submission and a
reply per turn, and the engine sees a wave of turns (the environments answered by its
last step) arrive one call at a time, so it steps on the first few and computes the rest
in more, smaller steps (``rollart bench turns``: 7-14 engine steps per wave of 64 turns
instead of 1). :class:`GenerateBatcher` collects the requests for its worker until the
event loop has gone ``QUIET_TICKS`` iterations without a new one (no wall-clock wait: a
wave's callers, woken by one reply, submit within a few iterations), then sends them as
one ``generate_many`` call (a streaming call on Ray): the engine starts them together,
and the results come back as they finish, those finished in one step in one message.
Each caller still awaits its own request's result, so a short turn never waits for a
long one.
The K/V releases of trajectories that end together go the same way (``release_many``).

Nothing else changes: the LLMProxy still routes, counts and aborts each request by
itself (an ABORT reaches the engine worker as before: ``EngineWorker.abort``); a request
whose caller gave up before the call was sent is not sent. When the call fails (the
worker died), every request of it not answered yet fails with that error, and the proxy
re-sends each as it would a lone one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from rollart_sdk.cluster.handles import WorkerHandle
from rollart_sdk.errors import RollartError
from rollart_sdk.types import GenerationRequest, GenerationResult

T = TypeVar("T")
QUIET_TICKS = 4  # loop iterations without a new request before the batch goes
MAX_BATCH = 256  # requests per call at most (bounds one message)


class Coalescer(Generic[T]):
    """Items added until the event loop has gone ``quiet_ticks`` iterations without a new
    one (or ``max_batch`` are waiting), then handed to ``flush`` together."""

    def __init__(self, flush: Callable[[list[T]], None], quiet_ticks: int = QUIET_TICKS,
                 max_batch: int = MAX_BATCH) -> None:
        self._flush = flush
        self.quiet_ticks = quiet_ticks
        self.max_batch = max_batch
        self._pending: list[T] = []
        self._scheduled = False
        self._seen = 0
        self._quiet = 0

    def add(self, item: T) -> None:
        self._pending.append(item)
        if not self._scheduled:
            self._schedule()

    def _schedule(self) -> None:
        self._scheduled, self._seen, self._quiet = True, len(self._pending), 0
        asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        n = len(self._pending)
        self._quiet = 0 if n != self._seen else self._quiet + 1
        self._seen = n
        if self._quiet < self.quiet_ticks and n < self.max_batch:
            asyncio.get_running_loop().call_soon(self._tick)
            return
        self._scheduled = False
        batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch:]
        if self._pending:  # more than one call's worth: the rest goes next
            self._schedule()
        self._flush(batch)


class GenerateBatcher:
    """One engine worker's ``generate`` calls, sent in batches (``generate_many``), and
    its ``release`` calls (the K/V kept for ended trajectories: ``release_many``)."""

    def __init__(self, worker: WorkerHandle, quiet_ticks: int = QUIET_TICKS,
                 max_batch: int = MAX_BATCH,
                 on_release: Callable[[asyncio.Task[Any]], None] | None = None) -> None:
        """``on_release``: given each ``release_many`` call's task (to track its end)."""
        self.worker = worker
        self._on_release = on_release
        self._queue: Coalescer[tuple[GenerationRequest, asyncio.Future[GenerationResult]]] = (
            Coalescer(self._dispatch, quiet_ticks, max_batch))
        self._releases: Coalescer[str] = Coalescer(self._release, quiet_ticks, max_batch)
        self._sends: set[asyncio.Task[Any]] = set()
        self.calls = 0  # generate_many calls sent
        self.sent = 0  # requests sent in them
        self.release_calls = 0  # release_many calls sent

    def release(self, trajectory_id: str) -> None:
        """Free the K/V the worker kept for the trajectory, with the others that end
        meanwhile, in the background (``on_release`` sees how the call ended)."""
        self._releases.add(trajectory_id)

    def _release(self, trajectory_ids: list[str]) -> None:
        self.release_calls += 1
        task = asyncio.ensure_future(self.worker.engine.release_many(trajectory_ids))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)
        if self._on_release is not None:
            self._on_release(task)

    def generate(self, request: GenerationRequest) -> asyncio.Future[GenerationResult]:
        """The result of ``request``, sent with the others that arrive meanwhile."""
        fut: asyncio.Future[GenerationResult] = asyncio.get_running_loop().create_future()
        self._queue.add((request, fut))
        return fut

    def _dispatch(self, batch: list[tuple[GenerationRequest,
                                          asyncio.Future[GenerationResult]]]) -> None:
        batch = [(r, f) for r, f in batch if not f.done()]  # callers that gave up
        if batch:
            task = asyncio.ensure_future(self._send(batch))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    async def _send(self, batch: list[tuple[GenerationRequest,
                                            asyncio.Future[GenerationResult]]]) -> None:
        self.calls += 1
        self.sent += len(batch)
        try:
            if len(batch) == 1:
                # One request: a plain call (on Ray a streaming call's stream costs
                # about 0.9 ms more per round trip; 1.43 against 2.3 ms on an idle
                # machine, and a wave often has one turn per engine under env latency)
                _settle(batch[0][1], await self.worker.engine.generate(batch[0][0]))
                return
            async for items in self.worker.engine.generate_many([r for r, _ in batch]):
                for index, result in items:
                    _settle(batch[index][1], result)
        except asyncio.CancelledError:
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - each waiting caller gets it (worker death)
            for _, fut in batch:
                _settle(fut, exc)
        for request, fut in batch:
            _settle(fut, RollartError(f"{self.worker.name}: generate_many ended without "
                                      f"a result for request {request.request_id}"))


def _settle(fut: asyncio.Future[Any], result: Any) -> None:
    if fut.done():
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result(result)
