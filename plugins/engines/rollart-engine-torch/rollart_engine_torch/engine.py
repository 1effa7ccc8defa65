"""Engine ``torch``: continuous batching with the paper's command loop (ADD / ABORT).

One background asyncio task owns the batch. Each turn of its loop:

1. applies queued commands - ADD (a request joins the waiting queue, then the running
   batch when a KV slot and the per-step prefill budget allow) and ABORT (a request
   leaves; its ``generate`` returns ``finish_reason="abort"`` with the tokens so far);
2. runs ONE engine step in a worker thread (``asyncio.to_thread``): prefill of newly
   admitted (or weight-updated) sequences, then one decode token for every running one.

Commands that arrive during a step are queued and applied right after it, so the batch is
never mutated under a running forward pass, and callers on the loop stay responsive.

What happens to an in-flight request at a weight update (paper step 5), in one place:
``load_weights`` waits for the current step to end, swaps the tensors, bumps ``version``
and marks every running sequence ``needs_prefill``; the next step re-prefills its prompt
plus the tokens generated so far under the new weights (its KV cache is recomputed) and
it continues from there. Tokens already produced keep the logprobs and version of the
policy that produced them.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from rollart_engine_torch.runner import SlotRunner
from rollart_engine_torch.sampling import choose_token
from rollart_sdk.config import ModelConfig
from rollart_sdk.errors import RollartError
from rollart_sdk.types import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    WeightBucket,
)


@dataclass(eq=False)
class _Seq:
    """One request's state inside the engine."""

    request: GenerationRequest
    tokens: list[int]  # prompt + generated so far
    future: asyncio.Future[GenerationResult]
    generator: torch.Generator
    stop_ids: frozenset[int]
    allowed: torch.Tensor | None
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    cached: int = 0  # tokens whose K/V are in the slot (all but the last once decoding)
    needs_prefill: bool = True
    recomputed: int = 0
    finish: FinishReason | None = None

    def result(self, worker: str = "") -> GenerationResult:
        return GenerationResult(
            request_id=self.request.request_id,
            token_ids=list(self.out_ids),
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            finish_reason=self.finish or "abort",
            recomputed=self.recomputed,
            worker=worker,
        )


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
    ) -> None:
        from rollart_sdk.models import load_causal_lm

        if model.path is None:
            raise RollartError(
                "engine 'torch' needs a prepared model with model.path set; call "
                "rollart_sdk.models.prepare_model(model, cache_dir) first (the pipeline "
                "does this for model.tiny and model.gguf)"
            )
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        hf = load_causal_lm(model.path, model.dtype)
        limit = int(getattr(hf.config, "max_position_embeddings", max_seq_len) or max_seq_len)
        self._runner = SlotRunner(hf, max_running, min(max_seq_len, limit), device)
        if eos_token_ids is None:
            eos = getattr(hf.generation_config, "eos_token_id", None)
            if eos is None:
                eos = getattr(hf.config, "eos_token_id", None)
            eos_token_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        self._eos = frozenset(int(e) for e in eos_token_ids)
        self._max_running = max_running
        self._max_prefill = max_prefill_tokens
        self._rng = random.Random(seed)
        self._version = 0
        self._suspended = False
        self._closed = False
        self._waiting: collections.deque[_Seq] = collections.deque()
        self._running: list[_Seq] = []  # index == KV slot
        self._by_id: dict[str, _Seq] = {}
        self._aborts: collections.deque[str] = collections.deque()
        self._tokens_generated = 0
        self._prefill_tokens = 0
        self._steps = 0
        self._recomputed_total = 0
        self._recompute_s = 0.0
        self._aborted_total = 0  # requests ended by ABORT (freed before finishing)
        self._name = f"torch-engine:{model.path}"
        # Created on first use: the engine may be built outside the loop that drives it.
        self._loop_task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._step_lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ protocol

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """ADD a request; resolves when it stops, hits a length limit or is aborted."""
        self._start()
        if self._closed:
            raise RollartError("engine 'torch' is shut down; create a new engine")
        seq = self._make_seq(request)
        self._by_id[request.request_id] = seq
        self._waiting.append(seq)
        self._kick()
        try:
            return await asyncio.shield(seq.future)
        except asyncio.CancelledError:
            # A caller that gives up must not leave its sequence occupying a slot.
            self._aborts.append(request.request_id)
            self._kick()
            raise

    async def abort(self, request_id: str) -> bool:
        """ABORT: True when the request was waiting or running (it then returns "abort")."""
        seq = self._by_id.get(request_id)
        if seq is None or seq.future.done():
            return False
        self._aborts.append(request_id)
        self._kick()
        return True

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
            staged = await asyncio.to_thread(self._stage, buckets)
            await asyncio.to_thread(self._runner.assign, staged)
            self._version = int(version)
            n = 0
            for seq in self._running:
                seq.needs_prefill = True
                seq.recomputed += 1
                n += 1
            self._recomputed_total += n
        self._kick()
        return n

    def stats(self) -> dict[str, Any]:
        return {
            "running": len(self._running),
            "waiting": len(self._waiting),
            "version": self._version,
            "tokens_generated": self._tokens_generated,
            "prefill_tokens": self._prefill_tokens,
            "steps": self._steps,
            "suspended": self._suspended,
            "recomputed": self._recomputed_total,
            "recompute_s": round(self._recompute_s, 6),
            "aborted": self._aborted_total,
            "max_running": self._max_running,
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

    async def _loop(self) -> None:
        assert self._wake is not None and self._step_lock is not None
        while not self._closed:
            self._wake.clear()
            self._apply_aborts()
            if not self._suspended:
                self._admit()
            if self._suspended or not self._running:
                await self._wake.wait()
                continue
            async with self._step_lock:
                if self._suspended:  # suspended while we waited for a weight update
                    continue
                try:
                    finished = await asyncio.to_thread(self._step)
                except Exception as exc:  # noqa: BLE001 - handed to every caller
                    self._fail_running(exc)
                    continue
            for seq in finished:
                self._resolve(seq, seq.finish or "abort")
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
                self._release([seq])
            self._aborted_total += 1
            self._resolve(seq, "abort")

    def _admit(self) -> None:
        budget = self._max_prefill
        first = True
        while self._waiting and len(self._running) < self._max_running:
            n = len(self._waiting[0].tokens)
            if n > budget and not first:
                break
            seq = self._waiting.popleft()
            self._running.append(seq)
            budget -= n
            first = False

    def _release(self, seqs: list[_Seq]) -> None:
        """Remove sequences from the batch, moving the last slots into the holes."""
        doomed = {id(s) for s in seqs}
        for slot in sorted((i for i, s in enumerate(self._running) if id(s) in doomed),
                           reverse=True):
            last = len(self._running) - 1
            if slot != last:
                mover = self._running[last]
                if not mover.needs_prefill:
                    self._runner.move_slot(last, slot, mover.cached)
                self._running[slot] = mover
            self._running.pop()

    def _fail_running(self, exc: Exception) -> None:
        """A step raised: its sequences' callers get the error instead of waiting forever;
        the engine keeps serving other requests."""
        err = RollartError(f"engine 'torch' step failed: {type(exc).__name__}: {exc}")
        for seq in self._running:
            self._by_id.pop(seq.request.request_id, None)
            if not seq.future.done():
                seq.future.set_exception(err)
        self._running.clear()

    def _resolve(self, seq: _Seq, reason: FinishReason) -> None:
        seq.finish = reason
        self._by_id.pop(seq.request.request_id, None)
        if not seq.future.done():
            seq.future.set_result(seq.result(self._name))

    # ------------------------------------------------------------------ one step (thread)

    def _step(self) -> list[_Seq]:
        """Prefill what needs it, then one decode token for every running sequence."""
        runner = self._runner
        finished: list[_Seq] = []
        for slot, seq in enumerate(self._running):
            if seq.needs_prefill:
                t0 = time.perf_counter()
                logits = runner.prefill(slot, seq.tokens)
                if seq.recomputed:  # KV cache rebuilt under new weights (weight-sync cost)
                    self._recompute_s += time.perf_counter() - t0
                self._prefill_tokens += len(seq.tokens)
                seq.cached = len(seq.tokens)
                seq.needs_prefill = False
                if self._append(seq, logits):
                    finished.append(seq)
        self._release(finished)
        if self._running:
            logits = runner.decode(
                [s.tokens[-1] for s in self._running], [s.cached for s in self._running]
            )
            done = []
            for row, seq in enumerate(self._running):
                seq.cached += 1
                if self._append(seq, logits[row]):
                    done.append(seq)
            self._release(done)
            finished += done
        self._steps += 1
        return finished

    def _append(self, seq: _Seq, logits: torch.Tensor) -> bool:
        """Sample, record the token with its unmodified logprob; True when seq is done."""
        params = seq.request.sampling
        tok = choose_token(logits, params, seq.generator, seq.allowed)
        logprob = float(torch.log_softmax(logits, dim=-1)[tok])
        seq.tokens.append(tok)
        seq.out_ids.append(tok)
        seq.logprobs.append(logprob)
        seq.versions.append(self._version)
        self._tokens_generated += 1
        if tok in seq.stop_ids:
            seq.finish = "stop"
        elif len(seq.out_ids) >= params.max_new_tokens or len(seq.tokens) >= self._runner.max_seq_len:
            seq.finish = "length"
        return seq.finish is not None

    # ------------------------------------------------------------------ helpers

    def _stage(self, buckets: Iterable[WeightBucket]) -> dict[str, Any]:
        """Collect and check every bucket before touching the model, so a failed or
        partial transfer leaves the old weights serving (all or nothing)."""
        staged: dict[str, Any] = {}
        for bucket in buckets:
            self._runner.check_tensors(bucket.tensors)
            staged.update(bucket.tensors)
        if not staged:
            raise ValueError("load_weights got no tensors; pass at least one WeightBucket")
        return staged

    def _make_seq(self, request: GenerationRequest) -> _Seq:
        rid = request.request_id
        if rid in self._by_id:
            raise ValueError(f"request_id {rid!r} is already being generated; ids must be unique")
        prompt = list(request.prompt_ids)
        vocab = self._runner.vocab_size
        limit = self._runner.max_seq_len
        if not prompt:
            raise ValueError(f"request {rid!r}: prompt_ids is empty; give at least one token")
        if len(prompt) >= limit:
            raise ValueError(
                f"request {rid!r}: prompt of {len(prompt)} tokens does not fit max_seq_len="
                f"{limit} (engine option max_seq_len, capped by the model); shorten the "
                "context or raise the option"
            )
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"request {rid!r}: token ids {bad[:5]} outside the vocabulary [0, {vocab})")
        sp = request.sampling
        if sp.max_new_tokens < 1:
            raise ValueError(f"request {rid!r}: max_new_tokens must be >= 1, got {sp.max_new_tokens}")
        allowed = None
        if sp.allowed_token_ids is not None:
            ids = sorted(set(sp.allowed_token_ids))
            if not ids or not all(0 <= t < vocab for t in ids):
                raise ValueError(
                    f"request {rid!r}: allowed_token_ids must be non-empty ids in [0, {vocab})"
                )
            allowed = torch.tensor(ids, dtype=torch.long)
        seed = sp.seed if sp.seed is not None else self._rng.getrandbits(63)
        gen = torch.Generator(device="cpu")
        gen.manual_seed(int(seed))
        loop = asyncio.get_running_loop()
        return _Seq(
            request=request,
            tokens=prompt,
            future=loop.create_future(),
            generator=gen,
            stop_ids=frozenset(sp.stop_token_ids) | self._eos,
            allowed=allowed,
        )
