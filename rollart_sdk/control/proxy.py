"""LLMProxy: the gateway between EnvManagers and inference workers.

- routes each request by its task tag to the workers on the hardware the task's affinity
  names (the route table from ``rollart_sdk.cluster.routing``), balancing by in-flight
  load inside that pool;
- keeps a trajectory on the worker that served its previous turn while it can (that
  worker holds its prefix);
- ``suspend`` stops admitting new requests (they wait), in-flight ones are kept;
  ``resume`` lets them through (protocol steps 2 and 4);
- ``abort`` delivers ABORT to the worker holding the request; the waiting caller gets
  an ``abort`` result, never a hang. A caller that gives up (a generate timeout, a
  cancel at run end) makes the proxy send ABORT too, so the engine frees the slot;
- a worker whose process died is taken out of the routes (``down``); its requests are
  re-sent to the task's other engines, or wait for it to come back (``up``, after it
  was restarted and loaded the current weights);
- prefill-decode disaggregation (``prefill_workers``): a request's prompt is computed by
  a prefill worker of its task's prefill pool (``prefill_routes``; least loaded, then
  sticky per trajectory like the decode worker) and its K/V handed to the (sticky) decode
  worker as a Ray ObjectRef, so the cache moves between the two through the object store,
  never through this process; the decode worker samples every token. With multi-turn KV
  reuse both keep a trajectory's cache between turns: at the next turn the decode worker
  hands its last answer's K/V to the prefill worker (``export_kv``, a ref), so the
  prefill worker computes only the observation, and the hand-off carries only the
  positions the decode worker lacks (the proxy passes on what its last result said it
  kept, ``kv_kept``); a hand-off that is stale or continues a cache the receiver lost is
  ignored (it computes what it lacks);
- ``release`` (a trajectory ended) frees the K/V its workers kept for a next turn;
- on Ray (``batch_calls``) the turns that reach one engine worker in the same few loop
  iterations go to it in one ``generate_many`` call (``control/batching.py``): one actor
  call per wave of turns instead of one per turn, and the engine batches them in one step.

It only routes: weights reach the engines through ``rollart_sdk.weights.WeightSync``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from rollart_sdk.cluster.handles import EngineClient, WorkerHandle
from rollart_sdk.control.batching import GenerateBatcher
from rollart_sdk.errors import RollartError, is_worker_death  # is_worker_death: its old home
from rollart_sdk.types import GenerationRequest, GenerationResult

# Times a request whose engine died is re-sent. A request during which its engine died
# this many times in a row may be what kills them (e.g. out of memory on its context): it
# is given up (RequestKillsEngines) instead of taking every engine of the pool down.
MAX_RESENDS = 2

T = TypeVar("T")


class RequestKillsEngines(RollartError):
    """The engines serving one request died ``MAX_RESENDS + 1`` times in a row."""


class LLMProxy:
    def __init__(self, workers: list[WorkerHandle], routes: dict[str, list[str]],
                 prefill_workers: list[WorkerHandle] | None = None,
                 prefill_routes: dict[str, list[str]] | None = None,
                 batch_calls: bool | None = None) -> None:
        """``routes``: task tag -> names of the workers that may serve it (``"default"``
        is used for tags without an entry). ``prefill_workers``: with prefill-decode
        disaggregation, the workers that compute prompts (``workers`` then decode);
        ``prefill_routes``: task tag -> the prefill workers of its pool (None: any).
        ``batch_calls``: send the turns that arrive together in one call per worker
        (:class:`GenerateBatcher`; the K/V releases of trajectories that end together
        too); None: for the workers that are Ray actors (in process a call costs nothing
        to batch away)."""
        self.workers = {w.name: w for w in workers}
        self.prefill_workers = {w.name: w for w in prefill_workers or []}
        _check_routes(routes, self.workers, "route")
        _check_routes(prefill_routes or {}, self.prefill_workers, "prefill route")
        self.routes = routes
        self.prefill_routes = prefill_routes or {}
        self._accepting = asyncio.Event()
        self._accepting.set()
        self._load: Counter[str] = Counter()
        # Bumped when a worker rejoins: a death reported by a call sent to an earlier
        # process of that worker must not take the restarted one out of the routes.
        self._incarnation: Counter[str] = Counter()
        self._sticky: dict[str, str] = {}  # trajectory id -> worker name
        self._sticky_prefill: dict[str, str] = {}  # trajectory id -> prefill worker name
        # PD: trajectory id -> (decode worker, tokens whose K/V it kept, their version,
        # tokens the prefill worker kept: the last prompt but its last token)
        self._held: dict[str, tuple[str, int, int, int]] = {}
        self._inflight: dict[str, str] = {}  # request id -> worker name
        self._admitting: set[str] = set()  # waiting for admission (suspended)
        self._aborted: set[str] = set()  # aborted while waiting for admission (<= _admitting)
        self.served: Counter[tuple[str, str]] = Counter()  # (tag, worker) -> requests
        self.down: dict[str, str] = {}  # worker name -> why it is out of the routes
        self._routes_changed = asyncio.Event()
        self._bg: set[asyncio.Task[Any]] = set()  # ABORTs sent on behalf of callers
        self.rerouted = 0  # requests re-sent because their worker died
        self.on_worker_death: list[Any] = []  # callbacks(name, error text)
        self.release_errors: Counter[str] = Counter()  # failed KV releases, by error type
        self.batch_calls = batch_calls
        self._batchers: dict[str, GenerateBatcher] = {}

    # ------------------------------------------------------------------ routing
    def candidates(self, tag: str) -> list[str]:
        names = self.routes.get(tag) or self.routes["default"]
        alive = [n for n in names if n not in self.down]
        if alive:
            return alive
        # The task's pool has no live engine: the recorded fallback, any live engine.
        return [n for n in self.routes.get("default", self.workers) if n not in self.down]

    def mark_down(self, name: str, why: str) -> None:
        if name in self.down:
            return
        self.down[name] = why
        for table in (self._sticky, self._sticky_prefill):
            for tid in [t for t, w in table.items() if w == name]:
                del table[tid]
        for tid in [t for t, h in self._held.items() if h[0] == name]:
            del self._held[tid]
        for fn in self.on_worker_death:
            fn(name, why)

    def mark_up(self, name: str) -> None:
        self.down.pop(name, None)
        self._incarnation[name] += 1
        self._routes_changed.set()

    def worker(self, name: str) -> WorkerHandle:
        """An engine worker by name (a decode/plain one or a prefill one)."""
        return self.workers.get(name) or self.prefill_workers[name]

    def live_workers(self) -> list[WorkerHandle]:
        """Every live engine worker (prefill workers too: they get weights and suspend)."""
        return [w for n, w in {**self.workers, **self.prefill_workers}.items()
                if n not in self.down]

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
        rid = request.request_id
        # Waiting (for admission, or for an engine when all of the task's are down): an
        # abort is noted in _aborted and wakes the wait; in flight: it goes to the engine.
        self._admitting.add(rid)
        deaths: list[str] = []
        try:
            if not self._accepting.is_set():
                await self._admission(rid)
            while True:
                while not self.candidates(request.tag) and rid not in self._aborted:
                    # Every engine is down: wait for one to be restarted (the caller's
                    # generate timeout bounds the wait).
                    self._routes_changed.clear()
                    await self._routes_changed.wait()
                if rid in self._aborted:  # aborted while waiting
                    return GenerationResult(rid, [], [], [], "abort")
                worker = self._pick(request)
                self._admitting.discard(rid)
                self._load[worker.name] += 1
                self._inflight[rid] = worker.name
                incarnation = self._incarnation[worker.name]
                try:
                    result: GenerationResult = await self._generate_on(worker, request)
                except asyncio.CancelledError:
                    # The caller gave up (timeout, run end): free the engine's slot too.
                    self._send_abort(worker, rid)
                    raise
                except Exception as exc:
                    if not is_worker_death(exc):
                        raise
                    if self._incarnation[worker.name] == incarnation:
                        self.mark_down(worker.name, f"{type(exc).__name__}: {exc}"[:500])
                    # else: sent to the process that died before; the restarted one serves
                    deaths.append(f"{worker.name}: {type(exc).__name__}")
                    if len(deaths) > MAX_RESENDS:
                        raise RequestKillsEngines(
                            f"request {rid}: its engine died {len(deaths)} times in a row "
                            f"({', '.join(deaths)}); not re-sent again, in case the request "
                            "itself kills them (e.g. out of memory on its context: check "
                            "the engine's logs and tasks[].max_context_tokens)") from exc
                    self.rerouted += 1
                    self._admitting.add(rid)
                    continue  # re-send to another engine of the task (or wait for one)
                finally:
                    self._load[worker.name] -= 1
                    self._inflight.pop(rid, None)
                self.served[(request.tag, worker.name)] += 1
                return result
        finally:
            self._admitting.discard(rid)
            self._aborted.discard(rid)

    async def _admission(self, rid: str) -> None:
        """Wait while the engines are suspended (a weight swap) until they accept requests
        again, or until ``rid`` is aborted (``abort`` wakes the wait): an abort returns at
        once, not after the swap, so that a stop never waits on requests held here."""
        while not self._accepting.is_set() and rid not in self._aborted:
            accept = asyncio.ensure_future(self._accepting.wait())
            changed = asyncio.ensure_future(self._routes_changed.wait())
            try:
                await asyncio.wait({accept, changed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                accept.cancel()
                changed.cancel()
            self._routes_changed.clear()

    async def _generate_on(self, worker: WorkerHandle,
                           request: GenerationRequest) -> GenerationResult:
        pre = self._pick_prefill(request)
        if pre is None:
            batcher = self._batcher(worker)
            if batcher is not None:
                return await batcher.generate(request)
            return await worker.engine.generate(request)
        tid = request.trajectory_id
        name, held, version, pre_has = self._held.pop(tid, ("", 0, -1, 0))
        answer = None
        if name != worker.name:  # another decode worker holds it (or none): send it all
            held, version = 0, -1
        elif held > pre_has:  # the answer the prefill worker lacks, from the decode worker
            answer = [worker.engine.submit_export_kv(tid, pre_has)]
        self._load[pre.name] += 1
        try:
            # ObjectRefs (in lists, so that Ray does not resolve them here): the workers
            # fetch the K/V straight from the object store (the decode worker's last
            # answer to the prefill worker, the prompt's to the decode worker); a failed
            # fetch makes the worker compute what it lacks itself.
            kv = pre.engine.submit_prefill_kv(request, held, version, answer)
            result = await worker.engine.generate(request, [kv])
        finally:
            self._load[pre.name] -= 1
        if tid and result.kv_kept and result.versions:
            self._held[tid] = (worker.name, result.kv_kept, result.versions[-1],
                               max(len(request.prompt_ids) - 1, 0))
        if result.handoff_worker_died:
            # The prefill worker's process is gone: out of the routes now (recovery brings
            # it back), not after every later request paid a failed hand-off.
            self.mark_down(pre.name, f"prefill hand-off: {result.handoff_error}"[:500])
        return result

    def _batcher(self, worker: WorkerHandle) -> GenerateBatcher | None:
        """The worker's batcher when its calls are batched (None: one call per turn)."""
        batch = worker.is_ray if self.batch_calls is None else self.batch_calls
        if not batch:
            return None
        batcher = self._batchers.get(worker.name)
        if batcher is None or batcher.worker is not worker:
            batcher = self._batchers[worker.name] = GenerateBatcher(
                worker, on_release=self._track_release)
        return batcher

    @property
    def batched_calls(self) -> tuple[int, int]:
        """(``generate_many`` calls sent, requests in them) over every worker."""
        return (sum(b.calls for b in self._batchers.values()),
                sum(b.sent for b in self._batchers.values()))

    def _pick_prefill(self, request: GenerationRequest) -> WorkerHandle | None:
        """The prefill worker of the request's trajectory while it is alive (it holds the
        earlier turns), else the least loaded of the task's prefill pool (any live one
        when that pool has none left)."""
        live = [n for n in self.prefill_workers if n not in self.down]
        if not live:
            return None  # no PD, or every prefill worker died: the decoder prefills
        tid = request.trajectory_id
        sticky = self._sticky_prefill.get(tid)
        if sticky in live:
            return self.prefill_workers[sticky]
        pool = self.prefill_routes.get(request.tag) or self.prefill_routes.get("default", [])
        names = [n for n in pool if n not in self.down] or live
        name = min(names, key=lambda n: (self._load[n], n))
        if tid:
            self._sticky_prefill[tid] = name
        return self.prefill_workers[name]

    def _send_abort(self, worker: WorkerHandle, request_id: str) -> None:
        async def send() -> None:
            try:
                await asyncio.wait_for(worker.engine.abort(request_id), 30)
            except Exception:  # noqa: BLE001 - a dead or slow engine has no slot to free
                pass

        task = asyncio.ensure_future(send())
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def abort(self, request_id: str) -> bool:
        name = self._inflight.get(request_id)
        if name is None:
            if request_id in self._admitting:
                self._aborted.add(request_id)
                self._routes_changed.set()  # a request waiting for an engine returns now
            return False
        if name in self.down:
            return False  # its requests died with it; generate() reports them
        try:
            return await self.workers[name].engine.abort(request_id)
        except Exception as exc:  # only a worker's death is absorbed
            if not is_worker_death(exc):
                raise
            # The worker died while we asked: nothing is left to abort there; its in-flight
            # generate() sees the death and is resubmitted or dropped with the reason.
            self.mark_down(name, f"{type(exc).__name__}: {exc}"[:500])
            return False

    def release(self, trajectory_id: str) -> None:
        """Forget a finished trajectory's worker bindings, and tell those workers (its
        decode worker and, with PD, its prefill worker) to free the K/V they kept for the
        trajectory's next turn (in the background)."""
        self._held.pop(trajectory_id, None)
        for table in (self._sticky, self._sticky_prefill):
            name = table.pop(trajectory_id, None)
            if name is None or name in self.down:
                continue
            worker = self.worker(name)
            batcher = self._batcher(worker)
            if batcher is not None:  # with the others that end meanwhile: one call
                batcher.release(trajectory_id)
                continue
            self._track_release(asyncio.ensure_future(worker.engine.release(trajectory_id)))

    def _track_release(self, task: asyncio.Task[Any]) -> None:
        self._bg.add(task)
        task.add_done_callback(self._released)

    def _released(self, task: asyncio.Task[Any]) -> None:
        self._bg.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # The kept K/V is evicted later anyway (LRU): count it, do not fail the run.
            self.release_errors[type(task.exception()).__name__] += 1

    async def suspend(self) -> None:
        self._accepting.clear()
        await self.broadcast(EngineClient.suspend)

    async def resume(self) -> None:
        try:
            await self.broadcast(EngineClient.resume)
        finally:
            self._accepting.set()

    async def broadcast(self, call: Callable[[EngineClient], Awaitable[T]]) -> list[T]:
        """``call`` every live worker (``EngineClient.suspend``, or ``lambda e: ...``); a
        worker that dies meanwhile is marked down and left out of the result (it catches
        up when restarted). Other errors are raised."""
        live = self.live_workers()
        results = await asyncio.gather(*(call(w.engine) for w in live),
                                       return_exceptions=True)
        out: list[T] = []
        for w, r in zip(live, results, strict=True):
            if isinstance(r, BaseException):
                if is_worker_death(r):
                    self.mark_down(w.name, f"{type(r).__name__}: {r}"[:500])
                    continue
                raise r
            out.append(r)
        return out


def _check_routes(routes: dict[str, list[str]], workers: dict[str, WorkerHandle],
                  what: str) -> None:
    for tag, names in routes.items():
        missing = [n for n in names if n not in workers]
        if missing or not names:
            raise ValueError(f"{what} for tag {tag!r} names unknown or no workers: {missing}")
