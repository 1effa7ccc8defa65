"""The ``sim`` inference engine: continuous batching on the virtual clock.

It implements the :class:`~rollart_sdk.interfaces.InferenceEngine` protocol (ADD through
``generate``, ABORT, suspend / resume, ``load_weights`` with KV recompute of in-flight
requests) but computes nothing: each engine step costs the roofline time of
:func:`~rollart_sdk.sim.costs.engine_step_s` on the worker's hardware class, slept on the
virtual clock. The number of tokens a request produces is drawn from its task's
``response_tokens`` distribution (seeded by the request's sampling seed, so every run of
the same config draws the same lengths).

To simulate thousands of concurrent requests cheaply the decode phase is event-driven,
not token by token: while the running batch does not change, every decode step takes the
same time, so the engine sleeps straight to the next completion (or until a new request
arrives, an ABORT, a suspend). A step that admits new requests is a mixed step: their
prefill (prompt tokens not in the prefix cache) plus one decode token for the running
batch. Admission respects ``max_running`` and the KV capacity of the device memory left
beside the weights (a request reserves its prompt plus its drawn response).

Prefill-decode disaggregation (``roles.actor_gen.prefill/decode``), as engine ``torch``
does it: ``prefill_kv`` prefills a prompt's uncached tokens in a step of its own (the
prefill engine keeps each trajectory's prefix too) and returns a :class:`SimKV` that
carries only the positions the decode engine lacks (``held``: what its last result said
it kept, ``kv_kept``); ``generate(request, kv=...)`` then prefills nothing and decodes
from its first step; at the next turn it hands the answer's K/V back (``export_kv``) and
the prefill computes only the observation. A hand-off's trip between the two takes
:meth:`SimEngine.kv_transfer_s` (at ``kv_link_gbps``) before the receiving engine uses it.

The engine is hosted by the real engine worker (:class:`rollart_sdk.cluster.roles.EngineWorker`):
:func:`create_engine` is engine ``sim``'s factory, ``factory(model=, **options)`` plus the
``sim`` context and the worker's ``binding`` that a simulated run offers. Weights arrive
through the worker's ``WeightStager`` from transport ``sim``; ``load_weights`` sleeps what
the swap still takes (the buckets' ``at_load``: a push broadcast, the load) before it
swaps.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.sim.costs import (
    Dist,
    HardwareClass,
    ModelSpec,
    engine_step_s,
    kv_capacity_tokens,
    prefill_pairs,
)
from rollart_sdk.types import GenerationRequest, GenerationResult

_EPS = 1e-9
_CACHE_ENTRIES = 65536  # trajectories whose prefix an engine remembers (LRU)


class SimEngineOptions(BaseModel):
    """Options of engine ``sim`` (``engine.options``)."""

    model_config = ConfigDict(extra="forbid")

    max_running: int = Field(256, ge=1, description="requests decoded at once (max_num_seqs)")
    devices: int = Field(1, ge=1, description="devices per engine worker (tensor parallel)")
    devices_by_hardware: dict[str, int] = Field(
        default_factory=dict, description="devices per engine on a hardware class "
                                          "(overrides devices), e.g. {H20: 2}")
    prefix_cache: bool = Field(True, description="a trajectory's next turn prefills only "
                                                 "the tokens its engine has not cached")
    kv_link_gbps: float = Field(200.0, gt=0, description="prefill-decode disaggregation: "
                                "Gb/s a K/V hand-off moves at (default: 200 Gb/s Ethernet "
                                "between clusters)")


@dataclass
class SimKV:
    """A simulated PD hand-off: K/V of a trajectory's first ``tokens`` modelled tokens at
    weights ``version``, of which positions ``start..tokens-1`` travel (the decode engine
    holds the first ``start``)."""

    tokens: int
    start: int
    version: int

    @property
    def carried(self) -> int:
        return self.tokens - self.start


class _Req:
    __slots__ = ("request", "prompt", "new", "n_out", "capped", "start", "future",
                 "switches", "base", "handoff_from")

    def __init__(self, request: GenerationRequest, prompt: int, new: int, n_out: int,
                 capped: bool, future: asyncio.Future[Any]) -> None:
        self.request = request
        self.prompt = prompt  # modelled tokens of context
        self.new = new  # of which not in the prefix cache
        self.n_out = n_out
        self.capped = capped
        self.start = 0.0  # decode-iteration counter at its first token
        self.future = future
        self.switches: list[tuple[float, int]] = []  # (tokens done, version before)
        self.base = 0.0  # prompt - start: its context is base + iteration counter
        self.handoff_from = -1  # PD prefill request: positions from here travel (else -1)


class SimEngine:
    """One engine worker's continuous batcher on the virtual clock."""

    def __init__(self, max_running: int = 256, devices: int = 1, prefix_cache: bool = True,
                 devices_by_hardware: dict[str, int] | None = None, kv_link_gbps: float = 200.0,
                 *, hardware: HardwareClass, model_spec: ModelSpec,
                 response_tokens: dict[str, Dist], token_block: int = 1,
                 hardware_name: str = "", name: str = "sim-engine", pool: str = "",
                 **_: Any) -> None:
        self.hw = hardware
        self.hardware_name = hardware_name
        self.pool = pool
        self.devices = (devices_by_hardware or {}).get(hardware_name, devices)
        self.spec = model_spec
        self.block = token_block
        self.max_running = max_running
        self.prefix_cache = prefix_cache
        self.kv_link_gbps = kv_link_gbps
        self.handoff_tokens_out = 0.0  # PD prefill side: modelled tokens whose K/V were sent
        self.handoff_short = 0  # PD decode side: hand-offs past a cache this engine lost
        self.handoff_tokens_back = 0.0  # PD decode side: answer tokens whose K/V went back
        self.capacity = kv_capacity_tokens(hardware, self.devices, model_spec)
        self.response_tokens = response_tokens
        self.name = name
        self._version = 0
        self._waiting: deque[_Req] = deque()
        # Admitted, in the prefill step now (neither waiting nor running): an abort
        # answers them at once and the step then frees their KV.
        self._prefilling: dict[str, _Req] = {}
        self._running: dict[str, _Req] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0
        self._it = 0.0  # decode iterations done (every running request gains one token each)
        self._sum_base = 0.0
        self._tag_n: dict[str, int] = {}  # running requests per task tag
        self._kv_used = 0
        self._cache: OrderedDict[str, int] = OrderedDict()  # trajectory -> cached tokens
        self._recompute_tokens = 0.0
        self._recompute_pairs = 0.0
        self._suspended = False
        self._wake: asyncio.Future[bool] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        # Statistics (stats()): what the profiler and the docs read.
        self.busy_s = 0.0
        self.recompute_s = 0.0
        self.steps = 0
        self.prefill_tokens = 0.0
        self.decode_tokens = 0.0
        self.tag_prefill_s: dict[str, float] = {}
        self.tag_decode_s: dict[str, float] = {}
        self.tag_tokens: dict[str, list[float]] = {}  # tag -> [prefill, decode] tokens

    # ------------------------------------------------------------------ protocol
    @property
    def version(self) -> int:
        return self._version

    async def generate(self, request: GenerationRequest, kv: SimKV | None = None
                       ) -> GenerationResult:
        """ADD; ``kv``: the prompt's K/V from a prefill engine (PD), used when it is of
        this version and continues what this engine holds of the trajectory (it first
        crosses the link: :meth:`kv_transfer_s`)."""
        if kv is not None:
            await asyncio.sleep(self.kv_transfer_s(kv))
        loop = self._start()
        prompt, cached = self._prompt_and_cached(request)
        new = prompt - cached if 0 < cached <= prompt else prompt
        if kv is not None and kv.version == self._version and kv.tokens >= prompt:
            if kv.start <= (cached if 0 < cached <= prompt else 0):
                new = 0  # the prefill engine computed it all: decode from the first step
            else:
                self.handoff_short += 1
        dist = self.response_tokens.get(request.tag) or self.response_tokens.get("default")
        if dist is None:
            raise ValueError(f"sim engine: no response_tokens for task {request.tag!r}")
        want = dist.draw_int(random.Random(request.sampling.seed), at_least=1)
        cap = request.sampling.max_new_tokens * self.block
        capped = want > cap
        n_out = min(want, cap)
        fut: asyncio.Future[GenerationResult] = loop.create_future()
        self._waiting.append(_Req(request, prompt, new, n_out, capped, fut))
        self._poke()
        return await fut

    async def prefill_kv(self, request: GenerationRequest, held: int = 0,
                         held_version: int | None = None, kv: SimKV | None = None) -> SimKV:
        """PD prefill side: prefill the prompt's uncached tokens (kept for the trajectory's
        next turn); the hand-off carries the positions after the ``held`` the decode
        engine holds at ``held_version`` (None: this engine's version). ``kv``: the
        decode engine's last answer (its :meth:`export_kv`), which then needs no
        prefill (it first crosses the link)."""
        if kv is not None:
            await asyncio.sleep(self.kv_transfer_s(kv))
        loop = self._start()
        prompt, cached = self._prompt_and_cached(request)
        if (kv is not None and kv.version == self._version and kv.start <= cached
                and kv.tokens <= prompt):
            cached = kv.tokens
        new = prompt - cached if 0 < cached <= prompt else prompt
        fut: asyncio.Future[Any] = loop.create_future()
        r = _Req(request, prompt, new, 0, False, fut)
        fresh = held_version is None or held_version == self._version
        r.handoff_from = min(held * self.block, prompt) if fresh else 0  # held: token ids
        self._waiting.append(r)
        self._poke()
        out: SimKV = await fut
        return out

    async def export_kv(self, trajectory_id: str, start: int) -> SimKV | None:
        """PD decode side: the trajectory's kept K/V from ``start`` on (the answer, for
        its next prefill), or None when this engine keeps nothing past ``start``."""
        kept, start = self._cache.get(trajectory_id, 0), start * self.block  # start: ids
        if kept <= start:
            return None
        self.handoff_tokens_back += kept - start
        return SimKV(kept, start, self._version)

    def kv_transfer_s(self, kv: SimKV) -> float:
        """Seconds a hand-off's K/V take over the PD link."""
        return kv.carried * self.spec.kv_bytes_per_token * 8 / (self.kv_link_gbps * 1e9)

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop_task is None:
            self._loop_task = loop.create_task(self._run(), name=f"{self.name}-loop")
        return loop

    def _prompt_and_cached(self, request: GenerationRequest) -> tuple[int, int]:
        prompt = len(request.prompt_ids) * self.block
        cached = self._cache.pop(request.trajectory_id, 0) if self.prefix_cache else 0
        return prompt, cached

    async def abort(self, request_id: str) -> bool:
        for r in self._waiting:
            if r.request.request_id == request_id:
                self._waiting.remove(r)
                self._finish(r, 0, "abort")
                return True
        r3 = self._prefilling.pop(request_id, None)
        if r3 is not None:
            self._finish(r3, 0, "abort")
            return True
        r2 = self._running.get(request_id)
        if r2 is None:
            return False
        self._drop_running(r2)
        self._finish(r2, int(self._it - r2.start), "abort")
        self._poke()
        return True

    async def release(self, trajectory_id: str) -> bool:
        """The trajectory ended: its cached prefix is freed."""
        return self._cache.pop(trajectory_id, None) is not None

    async def suspend(self) -> None:
        self._suspended = True
        self._poke()

    async def resume(self) -> None:
        self._suspended = False
        self._poke()

    async def load_weights(self, buckets: Any, version: int) -> int:
        """Swap versions: cached prefixes are invalid, every in-flight request's context is
        prefilled again (the recompute) before it continues. First sleeps what the swap
        still takes (the first bucket's ``at_load``, from transport ``sim``)."""
        for seconds in next(iter(getattr(b, "at_load", ()) for b in buckets), ()):
            await asyncio.sleep(seconds)
        for r in self._running.values():
            r.switches.append((self._it - r.start, self._version))
            ctx = r.base + self._it
            self._recompute_tokens += ctx
            self._recompute_pairs += prefill_pairs(ctx, 0)
        self._cache.clear()
        self._version = version
        return len(self._running)

    def stats(self) -> dict[str, Any]:
        return {
            "engine": "sim", "pool": self.pool, "hardware_name": self.hardware_name,
            "version": self._version, "hardware": self.hw.model_dump(),
            "devices": self.devices, "running": len(self._running),
            "waiting": len(self._waiting), "kv_capacity_tokens": self.capacity,
            "busy_s": self.busy_s, "recompute_s": self.recompute_s, "steps": self.steps,
            "prefill_tokens": self.prefill_tokens, "decode_tokens": self.decode_tokens,
            "handoff_tokens_out": self.handoff_tokens_out, "handoff_short": self.handoff_short,
            "handoff_tokens_back": self.handoff_tokens_back,
            "tag_prefill_s": dict(self.tag_prefill_s), "tag_decode_s": dict(self.tag_decode_s),
            "tag_tokens": {k: list(v) for k, v in self.tag_tokens.items()},
        }

    async def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()

    # ------------------------------------------------------------------ internals
    def _poke(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(True)

    async def _idle(self, timeout: float | None) -> bool:
        """Wait ``timeout`` virtual seconds (None: until poked); True when poked."""
        loop = asyncio.get_running_loop()
        self._wake = loop.create_future()
        handle = None
        if timeout is not None:
            handle = loop.call_later(max(timeout, 0.0), _settle, self._wake)
        try:
            return await self._wake
        finally:
            if handle is not None:
                handle.cancel()
            self._wake = None

    def _decode_ctx(self) -> float:
        return self._sum_base + len(self._running) * self._it

    def _finish(self, r: _Req, tokens: int, reason: str) -> None:
        if r.future.done():
            return
        blocks = -(-tokens // self.block) if tokens > 0 else 0
        versions: list[int] = []
        for done, ver in r.switches:  # blocks whose first token came before each swap
            upto = min(blocks, math.ceil(done / self.block))
            versions += [ver] * (upto - len(versions))
        versions += [self._version] * (blocks - len(versions))
        if r.handoff_from >= 0:  # a PD prefill that never ran: nothing to hand over
            r.future.set_result(SimKV(0, 0, self._version))
            return
        kept = self._cache.get(r.request.trajectory_id, 0) if reason != "abort" else 0
        kept = -(-kept // self.block)  # in token ids, as the LLMProxy counts them
        r.future.set_result(GenerationResult(
            r.request.request_id, [1] * blocks, [-1.0] * blocks, versions, reason,  # type: ignore[arg-type]
            recomputed=len(r.switches), kv_kept=kept))

    def _drop_running(self, r: _Req) -> None:
        del self._running[r.request.request_id]
        self._tag_n[r.request.tag] -= 1
        self._sum_base -= r.base
        self._kv_used -= r.prompt + r.n_out

    def _complete_due(self) -> None:
        while self._heap and self._heap[0][0] <= self._it + _EPS:
            _, _, rid = heapq.heappop(self._heap)
            r = self._running.get(rid)
            if r is None:  # aborted earlier
                continue
            self._drop_running(r)
            self._keep(r)
            self._finish(r, r.n_out, "length" if r.capped else "stop")

    def _keep(self, r: _Req) -> None:
        """Remember what the request's trajectory has cached here (its whole context)."""
        if self.prefix_cache and r.request.trajectory_id:
            self._cache[r.request.trajectory_id] = r.prompt + r.n_out
            while len(self._cache) > _CACHE_ENTRIES:
                self._cache.popitem(last=False)

    def _admit(self) -> list[_Req]:
        admitted: list[_Req] = []
        while self._waiting and len(self._running) + len(admitted) < self.max_running:
            r = self._waiting[0]
            need = r.prompt + r.n_out
            if need > self.capacity:  # would never fit: cut the response to what fits
                r.n_out, r.capped = max(0, self.capacity - r.prompt), True
                need = r.prompt + r.n_out
                if r.n_out == 0:
                    self._waiting.popleft()
                    self._finish(r, 0, "length")
                    continue
            if self._kv_used + need > self.capacity:
                break  # waits for KV room
            self._waiting.popleft()
            self._kv_used += need
            admitted.append(r)
        return admitted

    async def _sleep(self, seconds: float) -> None:
        self.busy_s += seconds
        self.steps += 1
        await asyncio.sleep(seconds)

    def _charge(self, table: dict[str, float], share: dict[str, float], seconds: float) -> None:
        total = sum(share.values())
        for tag, n in share.items():
            table[tag] = table.get(tag, 0.0) + seconds * n / total

    async def _run(self) -> None:
        while True:
            if self._suspended or (not self._running and not self._waiting
                                   and not self._recompute_tokens):
                await self._idle(None)
                continue
            if self._recompute_tokens:
                dt = engine_step_s(self.hw, self.devices, self.spec, self._recompute_tokens,
                                   self._recompute_pairs, 0, 0.0)
                self._recompute_tokens = self._recompute_pairs = 0.0
                self.recompute_s += dt
                await self._sleep(dt)
                continue
            admitted = self._admit()
            if admitted:
                await self._mixed_step(admitted)
                continue
            if not self._running:  # waiting for KV room that nothing will free
                await self._idle(None)
                continue
            await self._decode_segment()

    async def _mixed_step(self, admitted: list[_Req]) -> None:
        new = sum(r.new for r in admitted)
        pairs = sum(prefill_pairs(r.new, r.prompt - r.new) for r in admitted)
        batch = len(self._running)
        dt = engine_step_s(self.hw, self.devices, self.spec, new, pairs, batch,
                           self._decode_ctx(), prefill_seqs=len(admitted))
        share: dict[str, float] = {}
        for r in admitted:
            share[r.request.tag] = share.get(r.request.tag, 0.0) + r.new
            self.tag_tokens.setdefault(r.request.tag, [0.0, 0.0])[0] += r.new
        self.prefill_tokens += new
        if new:
            self._charge(self.tag_prefill_s, share, dt)
        self._prefilling = {r.request.request_id: r for r in admitted}
        await self._sleep(dt)
        admitted = self._drop_aborted_in_prefill(admitted)
        if batch:
            self._advance(1.0)
        for r in [r for r in admitted if r.handoff_from >= 0]:  # PD prefill: hand over
            self._kv_used -= r.prompt
            self._keep(r)
            self.handoff_tokens_out += r.prompt - r.handoff_from
            admitted.remove(r)
            if not r.future.done():
                r.future.set_result(SimKV(r.prompt, r.handoff_from, self._version))
        for r in admitted:  # the prefill produced each one's first token
            r.start = self._it - 1.0
            r.base = r.prompt - r.start
            self._running[r.request.request_id] = r
            self._tag_n[r.request.tag] = self._tag_n.get(r.request.tag, 0) + 1
            self._sum_base += r.base
            self._seq += 1
            heapq.heappush(self._heap, (r.start + r.n_out, self._seq, r.request.request_id))
        self._complete_due()

    def _drop_aborted_in_prefill(self, admitted: list[_Req]) -> list[_Req]:
        """Those of ``admitted`` not aborted during the prefill step; the aborted ones'
        KV freed (their answer went at the abort)."""
        kept = [r for r in admitted if r.request.request_id in self._prefilling]
        for r in admitted:
            if r.request.request_id not in self._prefilling:
                self._kv_used -= r.prompt + r.n_out
        self._prefilling = {}
        return kept

    def _advance(self, iters: float) -> None:
        for tag, n in self._tag_n.items():
            self.tag_tokens.setdefault(tag, [0.0, 0.0])[1] += n * iters
        self.decode_tokens += len(self._running) * iters
        self._it += iters

    async def _decode_segment(self) -> None:
        """Decode until the next completion, or until poked (arrival, abort, suspend)."""
        while self._heap and self._heap[0][2] not in self._running:
            heapq.heappop(self._heap)
        if not self._heap:
            return
        k = max(self._heap[0][0] - self._it, _EPS)
        batch = len(self._running)
        per = engine_step_s(self.hw, self.devices, self.spec, 0, 0.0, batch,
                            self._decode_ctx() + batch * k / 2)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        poked = await self._idle(k * per)
        elapsed = loop.time() - t0
        done = min(k, elapsed / per) if poked else k
        self.busy_s += elapsed
        self.steps += int(done)
        share = {tag: float(n) for tag, n in self._tag_n.items() if n}
        if share:
            self._charge(self.tag_decode_s, share, elapsed)
        self._advance(done)
        self._complete_due()


def create_engine(model: Any = None, *, sim: Any = None, binding: dict[str, Any] | None = None,
                  **options: Any) -> SimEngine:
    """Engine ``sim``'s factory (``factory(model=, **options)``): the engine's hardware
    class is its worker's binding's, the model, token block and each task's response
    lengths the run's (the ``sim`` context a simulated run offers)."""
    from rollart_sdk.sim.backends import _require

    ctx = _require(sim, "engine")
    b = binding or {}
    return SimEngine(**options, hardware=ctx.hardware_of(b), model_spec=ctx.model,
                     hardware_name=b.get("hardware", ""), pool=b.get("pool", ""),
                     response_tokens=ctx.response_tokens, token_block=ctx.token_block,
                     name=b.get("worker", "sim-engine"))


def _settle(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)
