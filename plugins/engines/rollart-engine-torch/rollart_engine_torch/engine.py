"""Engine ``torch``: continuous batching with the paper's command loop (ADD / ABORT).

One background asyncio task owns the batch. Each turn of its loop:

1. applies queued commands - ADD (a request joins the waiting queue, then the running
   batch when a KV slot and the per-step prefill budget allow) and ABORT (a request
   leaves; its ``generate`` returns ``finish_reason="abort"`` with the tokens so far). An
   ABORT whose ADD has not arrived yet (it overtook it on another connection) is
   remembered (the newest ``abort_memory`` ids) and the ADD then returns "abort" at once;
2. runs ONE engine step on the engine's own compute thread: one batched forward
   in which every running sequence feeds the tokens of its context that are not in its KV
   slot yet (a prompt, a new observation, or its last sampled token) and samples one
   (:mod:`rollart_engine_torch.step`). A step predicted to take at most ``inline_step_s``
   (the measured compute seconds per fed token times its tokens) runs on the loop itself:
   for a small model the thread hop and the GIL hand-overs around it cost more than the
   forward (issue 12: 5.8 ms per step in a thread against 4 ms inline). Steps and
   weight swaps always run on that one thread, never on whichever pool thread is free:
   torch keeps its OpenMP team, its thread count and malloc's arena per thread, and an
   engine sharing a process with a trainer (``layout: inprocess``) would otherwise pick up
   the trainer's thread count and fragment the heap (docs/benchmarks.md).
   A sync run in one process hands the engine the trainer's thread for this
   (``compute_executor``): engine and trainer alternate there, and one OpenMP team serves
   both; a second team anywhere in the process makes GNU OpenMP stop spinning at every
   barrier of both (docs/benchmarks.md, "Two OpenMP teams in one process").

Commands that arrive during a step are queued and applied right after it, so the batch is
never mutated under a running forward pass, and callers on the loop stay responsive.
Before a step the loop yields while requests keep arriving (at most ``batch_wait_s``), so
the turns of many environments answered by the previous step join one forward.

Multi-turn KV reuse: when a request of a trajectory finishes, its KV slot is kept for the
trajectory's next request, which then computes only its new tokens; :meth:`release` (the
trajectory ended), an ABORT, eviction (least recently used first) and a weight update free
kept slots (:mod:`rollart_engine_torch.slots`: per-request state and the slot table).

What happens to an in-flight request at a weight update (paper step 5), in one place:
``load_weights`` waits for the current step to end, swaps the tensors, bumps ``version``
and marks every running sequence's cache empty; the next step recomputes its prompt plus
the tokens generated so far under the new weights and it continues from there. Tokens
already produced keep the logprobs and version of the policy that produced them.

Prefill-decode disaggregation: :meth:`prefill_kv` computes the K/V of a request's prompt
(all but its last token) and hands them out as a :class:`KVHandoff`; ``generate(request,
kv=handoff)`` on another engine imports them into a slot and decodes from there. Sampling
happens on the decode side only, so a seeded request samples the same tokens with or
without the hand-off. Across a trajectory's turns both engines keep its cache: the prefill
engine computes only the new tokens, and the hand-off carries only the positions the
decode engine lacks (``held``: its last result's ``kv_kept``;
:mod:`rollart_engine_torch.handoff`).

The package: ``engine.py`` (this: the public API, the command loop, admission),
``slots.py`` (per-request state, KV slots and kept caches), ``step.py`` (one step: the
batched forward and sampling), ``handoff.py`` (the PD hand-off), ``runner.py`` (the
model's forward over KV slots), ``sampling.py`` (token choice).
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from rollart_engine_torch import handoff
from rollart_engine_torch.handoff import KVHandoff
from rollart_engine_torch.runner import SlotRunner
from rollart_engine_torch.slots import Seq, SlotTable
from rollart_engine_torch.step import StepCounts, run_step
from rollart_sdk.config import ModelConfig
from rollart_sdk.errors import RollartError
from rollart_sdk.types import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    WeightBucket,
)

_T = TypeVar("_T")


class TorchEngine:
    """A continuous-batching :class:`rollart_sdk.interfaces.InferenceEngine` on torch.

    ``model`` must have ``path`` set (see :func:`rollart_sdk.models.prepare_model`).
    Options are documented on :class:`rollart_engine_torch.options.TorchEngineOptions`.
    """

    def __init__(
        self,
        model: ModelConfig,
        device: str = "cpu",
        max_running: int = 16,
        max_seq_len: int = 2048,
        max_prefill_tokens: int = 4096,
        num_threads: int | None = None,
        eos_token_ids: list[int] | None = None,
        seed: int = 0,
        kv_slots: int | None = None,
        reuse_kv: bool = True,
        batch_wait_s: float = 0.002,
        abort_memory: int = 4096,
        inline_step_s: float = 0.004,
        burst_step_s: float = 0.02,
        compute_executor: Executor | None = None,
        burst_threads: int | None = None,
    ) -> None:
        """``compute_executor``: a one-thread executor to run the steps and weight swaps
        on instead of a thread of the engine's own (offered by a sync run in one process:
        the trainer's thread, so that the two share one OpenMP team; the engine then
        computes on that thread's torch threads and leaves the executor open at close).
        ``burst_threads``: torch threads for a long step (offered by a sync run on Ray,
        where nothing else computes while the engines generate: every core for steps
        that last, the plan's count for short ones, whose threads would only contend
        with the control plane); a step is long when the step before it on the compute
        thread took at least ``burst_step_s``. Not with an explicit ``num_threads`` or
        a ``compute_executor``."""
        from rollart_sdk.models import load_causal_lm

        if model.path is None:
            raise RollartError(
                "engine 'torch' needs a prepared model with model.path set; call "
                "rollart_sdk.models.prepare_model(model, cache_dir) first (the pipeline "
                "does this for model.tiny and model.gguf)"
            )
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        hf = load_causal_lm(model.path, model.dtype, model.implementation)
        limit = int(getattr(hf.config, "max_position_embeddings", max_seq_len) or max_seq_len)
        slots = kv_slots if kv_slots is not None else (2 * max_running if reuse_kv else max_running)
        if slots < max_running:
            raise ValueError(f"kv_slots ({slots}) must be at least max_running ({max_running})")
        self._runner = SlotRunner(hf, slots, min(max_seq_len, limit), device)
        # One thread for every step and weight swap (they hold _step_lock: one at a time).
        self._own_compute = compute_executor is None
        self._base_threads = torch.get_num_threads()
        self._burst = (burst_threads if burst_threads and burst_threads > self._base_threads
                       and num_threads is None and compute_executor is None else None)
        self._burst_s = burst_step_s
        self._last_took: float | None = None  # the last compute-thread step's seconds
        self._burst_steps = 0
        self._compute: Executor = compute_executor or ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="engine-torch",
            initializer=torch.set_num_threads, initargs=(torch.get_num_threads(),))
        if eos_token_ids is None:
            eos = getattr(hf.generation_config, "eos_token_id", None)
            if eos is None:
                eos = getattr(hf.config, "eos_token_id", None)
            eos_token_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        self._eos = frozenset(int(e) for e in eos_token_ids)
        self._max_running = max_running
        self._max_prefill = max_prefill_tokens
        self._reuse = reuse_kv
        self._batch_wait = batch_wait_s
        self._rng = random.Random(seed)
        self._version = 0
        self._suspended = False
        self._closed = False
        self._waiting: collections.deque[Seq] = collections.deque()
        self._running: list[Seq] = []
        self._by_id: dict[str, Seq] = {}
        self._aborts: collections.deque[str] = collections.deque()
        # ABORTs that arrived before their ADD (bounded: the newest abort_memory ids).
        self._early_aborts: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._abort_memory = abort_memory
        self._slots = SlotTable(slots)
        self._counts = StepCounts()
        self._recomputed_total = 0
        self._aborted_total = 0  # requests ended by ABORT (freed before finishing)
        self._handoff_short = 0  # PD hand-offs whose start this engine's cache lacked
        self._step_seconds = 0.0
        # Steps predicted to take at most this long run on the loop (no thread hop); the
        # prediction: compute seconds per fed token, measured on steps of >= 32 tokens.
        self._inline_s = inline_step_s
        self._s_per_token: float | None = None
        self._inline_steps = 0
        self._name = f"torch-engine:{model.path}"
        # Created on first use: the engine may be built outside the loop that drives it.
        self._loop_task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._step_lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ protocol

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, request: GenerationRequest, kv: KVHandoff | None = None
                       ) -> GenerationResult:
        """ADD a request; resolves when it stops, hits a length limit or is aborted.
        ``kv``: K/V of the prompt's prefix computed by another engine (PD)."""
        self._start()
        if self._closed:
            raise RollartError("engine 'torch' is shut down; create a new engine")
        seq = self._make_seq(request)
        if request.request_id in self._early_aborts:  # its ABORT overtook this ADD
            del self._early_aborts[request.request_id]
            self._aborted_total += 1
            self._slots.release(request.trajectory_id)
            seq.finish = "abort"
            return seq.result(self._name)
        if handoff.usable(kv, seq.tokens, self._version):
            seq.handoff = kv  # else stale or foreign: the prompt is simply computed here
        return await self._submit(seq)

    async def prefill_kv(self, request: GenerationRequest, held: int = 0,
                         held_version: int | None = None,
                         kv: KVHandoff | None = None) -> KVHandoff:
        """PD prefill side: the K/V of the prompt minus its last token, computed in the
        batch like any request (a trajectory's kept cache here covers its earlier turns),
        exported and kept for the trajectory's next turn. Samples nothing.

        ``held``: the decode engine already holds the K/V of the prompt's first ``held``
        tokens (its last result's ``kv_kept``) at weights ``held_version`` (None: this
        engine's version); only the positions after them are handed over. A stale
        ``held_version`` hands over everything. ``kv``: the decode engine's last answer
        for the trajectory (its :meth:`export_kv`), imported instead of computed."""
        self._start()
        if self._closed:
            raise RollartError("engine 'torch' is shut down; create a new engine")
        if held < 0:
            raise ValueError(f"prefill_kv: held={held} must be >= 0 (tokens the decode "
                             "engine holds; 0 when it holds none)")
        seq = self._make_seq(request)
        prefix = seq.tokens[:-1]
        if not prefix:
            return handoff.empty(self._runner, self._version)
        seq.tokens = prefix
        seq.prefill_only = True
        if held_version is None or held_version == self._version:
            seq.export_from = min(held, len(prefix))
        if handoff.usable(kv, prefix, self._version):
            seq.handoff = kv
        return await self._submit(seq)

    async def _submit(self, seq: Seq) -> Any:
        rid = seq.request.request_id
        self._by_id[rid] = seq
        self._waiting.append(seq)
        self._kick()
        try:
            return await asyncio.shield(seq.future)
        except asyncio.CancelledError:
            # A caller that gives up must not leave its sequence occupying a slot.
            self._aborts.append(rid)
            self._kick()
            raise

    async def abort(self, request_id: str) -> bool:
        """ABORT: True when the request was waiting or running (it then returns "abort").
        An unknown id is remembered, so an ADD arriving after its ABORT returns "abort"."""
        seq = self._by_id.get(request_id)
        if seq is None:
            self._early_aborts[request_id] = None
            self._early_aborts.move_to_end(request_id)
            while len(self._early_aborts) > self._abort_memory:
                self._early_aborts.popitem(last=False)
            return False
        if seq.future.done():
            return False
        self._aborts.append(request_id)
        self._kick()
        return True

    async def export_kv(self, trajectory_id: str, start: int) -> KVHandoff | None:
        """PD decode side: the K/V this engine kept for ``trajectory_id`` from position
        ``start`` on (the answer it sampled, which the prefill engine lacks), or None when
        it keeps nothing past ``start``. Taken between steps; the cache stays kept."""
        self._start()
        idle = self._slots.idle.get(trajectory_id) if trajectory_id else None
        if idle is None:
            return None
        assert self._step_lock is not None
        async with self._step_lock:
            return handoff.kept(self._runner, idle, max(start, 0))

    async def release(self, trajectory_id: str) -> bool:
        """The trajectory ended: free the KV kept for its next turn. True if one was kept."""
        return self._slots.release(trajectory_id)

    async def suspend(self) -> None:
        """Stop admitting and advancing; returns once the current step (if any) ended."""
        self._start()
        self._suspended = True
        assert self._step_lock is not None
        async with self._step_lock:
            pass

    async def resume(self) -> None:
        self._suspended = False
        self._kick()

    async def load_weights(self, buckets: Iterable[WeightBucket], version: int) -> int:
        """Swap in ``buckets`` (all of them or none), set ``version``, mark in-flight
        sequences for KV recomputation. Returns how many will be recomputed."""
        self._start()
        assert self._step_lock is not None
        async with self._step_lock:
            # Reading buckets may block (a transport pulling them); keep the loop free.
            staged = await self._on_compute(self._stage, buckets)
            await self._on_compute(self._runner.assign, staged)
            self._version = int(version)
            n = 0
            for seq in self._running:
                if seq.prefill_only:  # computed afresh; the decode side's cache is stale too
                    seq.cached = seq.export_from = 0
                    continue
                seq.cached = 0
                seq.handoff = None
                seq.recomputing = True
                seq.recomputed += 1
                n += 1
            self._slots.release_all()  # old-policy K/V: the next turn recomputes
            self._recomputed_total += n
        self._kick()
        return n

    def stats(self) -> dict[str, Any]:
        return {
            "running": len(self._running),
            "waiting": len(self._waiting),
            "version": self._version,
            "tokens_generated": self._counts.tokens_generated,
            "prefill_tokens": self._counts.prefill_tokens,
            "reused_tokens": self._counts.reused_tokens,
            "shared_tokens": self._counts.shared_tokens,
            "kv_idle": len(self._slots.idle),
            "kv_evicted": self._slots.evicted,
            "handoff_tokens_out": self._counts.handoff_out,  # PD prefill: K/V positions sent
            "handoff_short": self._handoff_short,  # PD: hand-offs past a cache it lost
            "steps": self._counts.steps,
            "step_seconds": round(self._step_seconds, 4),
            "inline_steps": self._inline_steps,  # steps run on the loop (inline_step_s)
            "burst_steps": self._burst_steps,  # steps on burst_threads (sync on Ray)
            "suspended": self._suspended,
            "recomputed": self._recomputed_total,
            "recompute_s": round(self._counts.recompute_s, 6),
            "aborted": self._aborted_total,
            "max_running": self._max_running,
            "kv_slots": self._runner.num_slots,
            "max_seq_len": self._runner.max_seq_len,
            "kv_cache_bytes": self._runner.kv_bytes(),
            "kv_cache_bytes_max": self._runner.kv_bytes_max(),
        }

    async def shutdown(self) -> None:
        """Abort everything still queued or running and stop the loop."""
        self._closed = True
        self._kick()
        task, self._loop_task = self._loop_task, None
        if task is not None and not task.done():
            await task  # ends after the current step; the loop checks _closed each turn
        for seq in [*self._waiting, *self._running]:
            self._resolve(seq, "abort")
        self._waiting.clear()
        self._running.clear()
        self._slots.idle.clear()
        if self._own_compute:
            self._compute.shutdown(wait=False)

    async def _on_compute(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the engine's compute thread."""
        return await asyncio.get_running_loop().run_in_executor(self._compute, fn, *args)

    # ------------------------------------------------------------------ command loop

    def _start(self) -> None:
        if self._loop_task is None and not self._closed:
            self._wake = asyncio.Event()
            self._step_lock = asyncio.Lock()
            self._loop_task = asyncio.get_running_loop().create_task(self._loop())
            self._loop_task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """If the command loop dies, no caller may be left waiting: fail them all."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        self._closed = True
        err = RollartError(f"engine 'torch' command loop failed: {type(exc).__name__}: {exc}")
        for seq in [*self._waiting, *self._running]:
            if not seq.future.done():
                seq.future.set_exception(err)
        self._waiting.clear()
        self._running.clear()
        self._by_id.clear()

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _gather_arrivals(self) -> None:
        """Yield while requests keep arriving (callers woken by the last step submit their
        next turn within a few loop iterations), at most ``batch_wait_s``."""
        if self._batch_wait <= 0 or len(self._running) >= self._max_running:
            return
        deadline = time.perf_counter() + self._batch_wait
        seen = -1
        while len(self._waiting) != seen and time.perf_counter() < deadline:
            seen = len(self._waiting)
            for _ in range(4):
                await asyncio.sleep(0)

    async def _loop(self) -> None:
        assert self._wake is not None and self._step_lock is not None
        while not self._closed:
            self._wake.clear()
            await self._gather_arrivals()
            self._apply_aborts()
            if not self._suspended:
                self._admit()
            if self._suspended or not self._running:
                await self._wake.wait()
                continue
            async with self._step_lock:
                if self._suspended:  # suspended while we waited for a weight update
                    continue
                t0 = time.perf_counter()
                fed = sum(len(s.tokens) - s.cached for s in self._running)
                try:
                    if (self._s_per_token is not None
                            and fed * self._s_per_token <= self._inline_s):
                        self._inline_steps += 1
                        finished, took = _timed_step(self._runner, self._running,
                                                     self._version, self._counts)
                    else:
                        threads = None
                        if self._burst is not None:  # long steps on every core
                            long = (self._last_took is not None
                                    and self._last_took >= self._burst_s)
                            threads = self._burst if long else self._base_threads
                            self._burst_steps += long
                        finished, took = await self._on_compute(
                            _timed_step, self._runner, self._running, self._version,
                            self._counts, threads)
                        self._last_took = took
                except Exception as exc:  # noqa: BLE001 - handed to every caller
                    self._fail_running(exc)
                    continue
                finally:
                    self._step_seconds += time.perf_counter() - t0
                if fed >= 32:
                    rate = took / fed
                    self._s_per_token = rate if self._s_per_token is None else (
                        0.8 * self._s_per_token + 0.2 * rate)
            for seq in finished:
                self._finish(seq)
            await asyncio.sleep(0)  # let callers queue commands between steps

    def _apply_aborts(self) -> None:
        while self._aborts:
            rid = self._aborts.popleft()
            seq = self._by_id.get(rid)
            if seq is None or seq.future.done():
                continue
            if seq in self._waiting:
                self._waiting.remove(seq)
            else:
                self._running.remove(seq)
                self._slots.free(seq.slot)
            self._slots.release(seq.request.trajectory_id)
            self._aborted_total += 1
            self._resolve(seq, "abort")

    def _admit(self) -> None:
        budget = self._max_prefill
        first = True
        while self._waiting and len(self._running) < self._max_running:
            seq = self._waiting[0]
            idle, reuse = self._slots.lookup(seq, self._version)
            n = len(seq.tokens) - reuse
            if n > budget and not first:
                break
            self._waiting.popleft()
            self._slots.assign(seq, idle)
            seq.cached = reuse
            if seq.handoff is not None and seq.handoff.start > reuse:
                # The hand-off continues a cache this engine no longer holds (evicted, or
                # dropped at a weight update): what it lacks is computed here instead.
                seq.handoff = None
                self._handoff_short += 1
            self._counts.reused_tokens += reuse
            self._running.append(seq)
            budget -= n
            first = False

    def _finish(self, seq: Seq) -> None:
        """A step ended ``seq``: keep its KV for the trajectory's next turn, or free it."""
        self._running.remove(seq)
        tid = seq.request.trajectory_id
        if self._reuse and tid and not self._closed and seq.cached:
            self._slots.keep(tid, seq.slot, seq.tokens[: seq.cached], self._version)
            seq.kv_kept = seq.cached
        else:
            self._slots.free(seq.slot)
        self._resolve(seq, seq.finish or "abort")

    def _fail_running(self, exc: Exception) -> None:
        """A step raised: its sequences' callers get the error instead of waiting forever;
        the engine keeps serving other requests."""
        err = RollartError(f"engine 'torch' step failed: {type(exc).__name__}: {exc}")
        for seq in self._running:
            self._by_id.pop(seq.request.request_id, None)
            self._slots.free(seq.slot)
            if not seq.future.done():
                seq.future.set_exception(err)
        self._running.clear()

    def _resolve(self, seq: Seq, reason: FinishReason) -> None:
        seq.finish = reason
        self._by_id.pop(seq.request.request_id, None)
        if seq.future.done():
            return
        if seq.prefill_only:  # its K/V, or an empty hand-off if aborted
            seq.future.set_result(handoff.result(self._runner, seq, self._version))
            return
        seq.future.set_result(seq.result(self._name))

    # ------------------------------------------------------------------ helpers

    def _stage(self, buckets: Iterable[WeightBucket]) -> dict[str, Any]:
        """Collect and check every bucket before touching the model, so a failed or
        partial transfer leaves the old weights serving (all or nothing)."""
        staged: dict[str, Any] = {}
        for bucket in buckets:
            staged.update(bucket.tensors)
        if not staged:
            raise ValueError("load_weights got no tensors; pass at least one WeightBucket")
        # checked whole: a LoRA pair may straddle two buckets
        self._runner.check_tensors(staged)
        return staged

    def _make_seq(self, request: GenerationRequest) -> Seq:
        rid = request.request_id
        if rid in self._by_id:
            raise ValueError(f"request_id {rid!r} is already being generated; ids must be unique")
        return Seq.from_request(request, vocab_size=self._runner.vocab_size,
                                max_seq_len=self._runner.max_seq_len, eos=self._eos,
                                rng=self._rng)


def _timed_step(runner: Any, running: list[Seq], version: int,
                counts: StepCounts, threads: int | None = None) -> tuple[list[Seq], float]:
    """:func:`run_step` and its compute seconds (without a thread hop's waits), on
    ``threads`` torch threads when given (the calling thread's count is set)."""
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    finished = run_step(runner, running, version, counts)
    return finished, time.perf_counter() - t0
