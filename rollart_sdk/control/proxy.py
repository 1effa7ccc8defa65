"""LLMProxy: the gateway between EnvManagers and inference workers.

- routes each request by its task tag to the workers on the hardware the task's affinity
  names (the route table from ``rollart_sdk.cluster.routing``), balancing by in-flight
  load inside that pool;
- keeps a trajectory on the worker that served its previous turn while it can (that
  worker holds its prefix);
- ``suspend`` stops admitting new requests (they wait), in-flight ones are kept;
  ``resume`` lets them through (protocol steps 2 and 4);
- ``abort`` delivers ABORT to the worker holding the request; the waiting caller gets
  an ``abort`` result, never a hang.

It only routes: weights reach the engines through ``rollart_sdk.weights.WeightSync``.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from rollart_sdk.cluster.routing import candidates
from rollart_sdk.control.handles import WorkerHandle
from rollart_sdk.types import GenerationRequest, GenerationResult


class LLMProxy:
    def __init__(self, workers: list[WorkerHandle], routes: dict[str, list[str]]) -> None:
        """``routes``: task tag -> names of the workers that may serve it (``"default"``
        is used for tags without an entry)."""
        self.workers = {w.name: w for w in workers}
        for tag, names in routes.items():
            missing = [n for n in names if n not in self.workers]
            if missing or not names:
                raise ValueError(f"route for tag {tag!r} names unknown or no workers: {missing}")
        self.routes = routes
        self._accepting = asyncio.Event()
        self._accepting.set()
        self._load: Counter[str] = Counter()
        self._sticky: dict[str, str] = {}  # trajectory id -> worker name
        self._inflight: dict[str, str] = {}  # request id -> worker name
        self._aborted: set[str] = set()  # aborted before reaching a worker
        self.served: Counter[tuple[str, str]] = Counter()  # (tag, worker) -> requests

    # ------------------------------------------------------------------ routing
    def candidates(self, tag: str) -> list[str]:
        return candidates(self.routes, tag)

    def _pick(self, request: GenerationRequest) -> WorkerHandle:
        names = self.candidates(request.tag)
        sticky = self._sticky.get(request.trajectory_id)
        if sticky in names:
            return self.workers[sticky]
        name = min(names, key=lambda n: (self._load[n], n))
        if request.trajectory_id:
            self._sticky[request.trajectory_id] = name
        return self.workers[name]

    # ------------------------------------------------------------------ commands
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        await self._accepting.wait()
        if request.request_id in self._aborted:  # aborted while waiting for admission
            self._aborted.discard(request.request_id)
            return GenerationResult(request.request_id, [], [], [], "abort")
        worker = self._pick(request)
        self._load[worker.name] += 1
        self._inflight[request.request_id] = worker.name
        try:
            result: GenerationResult = await worker.call("generate", request)
        finally:
            self._load[worker.name] -= 1
            self._inflight.pop(request.request_id, None)
        self.served[(request.tag, worker.name)] += 1
        return result

    async def abort(self, request_id: str) -> bool:
        name = self._inflight.get(request_id)
        if name is None:
            self._aborted.add(request_id)
            return False
        return bool(await self.workers[name].call("abort", request_id))

    def release(self, trajectory_id: str) -> None:
        """Forget a finished trajectory's worker binding."""
        self._sticky.pop(trajectory_id, None)

    async def suspend(self) -> None:
        self._accepting.clear()
        await asyncio.gather(*(w.call("suspend") for w in self.workers.values()))

    async def resume(self) -> None:
        await asyncio.gather(*(w.call("resume") for w in self.workers.values()))
        self._accepting.set()
