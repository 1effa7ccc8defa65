"""What the adapters of external engines (``rollart-engine-vllm``, ``rollart-engine-sglang``)
share: the bookkeeping of an :class:`rollart_sdk.interfaces.InferenceEngine` that drives an
engine which owns its batch and is told only ADD / ABORT / pause / continue.

- :class:`AdapterRequest`: one ``GenerationRequest`` across its submissions to the engine
  (one more per weight update it spans): its tokens, logprobs and versions so far, and the
  flags (``aborted``, ``resubmit``) and events (``finished``, ``wake``) the command loop
  coordinates with.
- :class:`EngineAdapter`: the protocol methods that do not depend on the engine
  (``generate``, ``abort``, ``suspend``, ``resume``, ``load_weights``' lock, ``stats``,
  ``shutdown``) over hooks each adapter implements with its engine's own calls
  (``_drive``, ``_abort_submission``, ``_pause``, ``_continue``, ``_settle``,
  ``_prepare``, ``_swap``, ``_close``), and the submission helpers every ``_drive`` uses
  (``_next_submission``, ``_max_tokens``, ``_stop_ids``, :func:`submission_seed`).
- :func:`checkpoint_shapes` / :func:`convert_buckets`: weight buckets checked against the
  served checkpoint's tensor names and shapes before the engine is touched (all or nothing).

Nothing here imports an engine; ``tests/test_engine_adapter.py`` runs it on a scripted one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from rollart_sdk.errors import RollartError
from rollart_sdk.interfaces import check_request
from rollart_sdk.types import FinishReason, GenerationRequest, GenerationResult, WeightBucket
from rollart_sdk.weights.lora import CheckpointBase, PayloadMerger, is_adapter_name

log = logging.getLogger(__name__)
T = TypeVar("T")
SEED_STRIDE = 1_000_003  # a resubmission's seed moves by this per token generated so far


@dataclass(eq=False)
class AdapterRequest:
    """One GenerationRequest across its engine submissions (one more per weight update)."""

    request: GenerationRequest
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    recomputed: int = 0
    attempt: int = 0  # engine submissions so far (> 0: it has started)
    sub_id: str | None = None  # the engine's id of the submission in flight
    aborted: bool = False  # the caller (or shutdown) asked to stop
    resubmit: bool = False  # a weight update took it out of the engine; it goes back in
    finished: asyncio.Event = field(default_factory=asyncio.Event)  # current submission ended
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def result(self, reason: FinishReason, worker: str) -> GenerationResult:
        return GenerationResult(
            request_id=self.request.request_id,
            token_ids=list(self.out_ids),
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            finish_reason=reason,
            recomputed=self.recomputed,
            worker=worker,
        )


R = TypeVar("R", bound=AdapterRequest)


@dataclass
class StagedVersion:
    """What ``_swap`` gets on the collective path: a version the engine's own workers
    received and hold (``rollart_sdk.weights.direct.WorkerStaging``)."""

    version: int


def combine_status(statuses: list[dict[str, Any]]) -> dict[str, Any]:
    """Several workers' ``WorkerStaging.status`` as one: their version (None unless they
    all stage the same), ready when all are, the first error, the slowest transfer."""
    versions = {s["version"] for s in statuses}
    errors = [s["error"] for s in statuses if s["error"]]
    return {"version": versions.pop() if len(versions) == 1 else None,
            "ready": bool(statuses) and all(s["ready"] for s in statuses),
            "error": errors[0] if errors else None,
            "transfer_s": max((s["transfer_s"] for s in statuses), default=0.0)}


def checkpoint_shapes(path: str) -> dict[str, tuple[list[int], str]]:
    """Name -> (shape, dtype) of every tensor in a checkpoint folder's safetensors files.

    A model with tied word embeddings (``tie_word_embeddings`` in its ``config.json``,
    SmolLM2's) stores no ``lm_head.weight``, but a trainer's ``state_dict`` has it: it is
    listed with the embedding's shape, so such a bucket passes the check (the engines'
    loaders skip it, the embedding carries the values)."""
    shapes: dict[str, tuple[list[int], str]] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name != "__metadata__":
                shapes[name] = (list(meta["shape"]), str(meta["dtype"]))
    embed = shapes.get("model.embed_tokens.weight")
    if embed is not None and "lm_head.weight" not in shapes and _tied(Path(path)):
        shapes["lm_head.weight"] = embed
    return shapes


def _tied(folder: Path) -> bool:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(config.get("tie_word_embeddings", False))


def convert_buckets(buckets: Iterable[WeightBucket], shapes: Mapping[str, tuple[list[int], str]],
                    convert: Callable[[WeightBucket], T],
                    base: CheckpointBase | None = None) -> list[T]:
    """``convert`` of every bucket, each checked first against the served checkpoint's
    ``shapes`` (from :func:`checkpoint_shapes`), so that a bad or partial transfer raises
    ``ValueError`` before the engine is touched (all or nothing).

    LoRA adapter payloads (:mod:`rollart_sdk.weights.lora`): with ``base`` (the served
    checkpoint's tensors), each adapter pair is merged into its full weight
    ``W0 + B @ A`` here, and one more bucket carries the checkpoint's other tensors of
    the adapted modules (:class:`~rollart_sdk.weights.lora.PayloadMerger`), so the engine
    loads full weights as ever; without ``base`` an adapter payload is an error."""
    out: list[T] = []
    merger = PayloadMerger(base, shapes) if base is not None else None
    last: WeightBucket | None = None
    for bucket in buckets:
        last = bucket
        if merger is not None:
            bucket = WeightBucket(bucket.version, bucket.index, merger.feed(bucket.tensors))
            if not bucket.tensors:  # only factors whose partners come later
                continue
        _check_bucket(bucket, shapes)
        out.append(convert(bucket))
    if merger is not None and last is not None:
        fill = merger.finish()
        if fill:
            out.append(convert(WeightBucket(last.version, last.index + 1, fill)))
    if not out:
        raise ValueError("load_weights got no buckets; pass at least one WeightBucket")
    return out


def _check_bucket(bucket: WeightBucket, shapes: Mapping[str, tuple[list[int], str]]) -> None:
    problems = []
    for name, t in bucket.tensors.items():
        want = shapes.get(name)
        if want is None and is_adapter_name(name):
            problems.append(f"{name!r} is a LoRA adapter factor and this engine merges "
                            "no adapters (convert_buckets was given no base)")
        elif want is None:
            problems.append(f"{name!r} is not a tensor of the served checkpoint")
        elif list(t.shape) != want[0]:
            problems.append(f"{name!r} has shape {list(t.shape)}, the model {want[0]}")
    if problems:
        raise ValueError(
            f"weight bucket {bucket.index} of version {bucket.version}: "
            + "; ".join(problems[:5])
        )


def eos_ids(hf_config: Any, given: list[int] | None) -> list[int]:
    """``given``, else the model config's ``eos_token_id`` (an int, a list or None)."""
    if given is None:
        eos = getattr(hf_config, "eos_token_id", None)
        given = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    return [int(e) for e in given]


def submission_seed(seed: int, attempt: int, generated: int) -> int:
    """The seed of a request's ``attempt``-th submission: its own on the first, a fresh
    stream (not the first one again) on a resubmission after ``generated`` tokens."""
    if attempt <= 1:
        return seed
    return (seed + SEED_STRIDE * generated) % (1 << 63)


class EngineAdapter(Generic[R]):
    """Engine-independent half of an adapter over request states of type ``R``; subclasses
    set the attributes below and implement the hooks. ``ENGINE`` names the engine in errors; ``LIMIT_OPTION`` /
    ``LIMIT_HINT`` name the option that bounds ``max_model_len`` in request errors."""

    ENGINE = "engine"
    LIMIT_OPTION = "max_model_len"
    LIMIT_HINT = ""
    SHUTDOWN_WAIT_S = 30.0  # shutdown waits this long for aborted submissions to end
    max_model_len: int
    vocab_size: int
    _eos: list[int]

    def _init_adapter(self, name: str) -> None:
        self._name = name
        self._version = 0
        self._suspended = False
        self._closed = False
        self._reqs: dict[str, R] = {}
        self._update_lock: asyncio.Lock | None = None
        self._tokens_generated = 0
        self._outputs = 0
        self._recomputed_total = 0
        self._aborted_total = 0
        self._prompt_tokens = 0  # prompt tokens submitted (resubmissions included)
        self._cached_tokens = 0  # of which the engine found in its prefix cache

    # ------------------------------------------------------------------ hooks

    def _new_request(self, request: GenerationRequest) -> R:
        raise NotImplementedError

    async def _drive(self, st: R) -> FinishReason:
        """Submit ``st`` (again after each weight update) until it finishes. When the
        caller is cancelled while a submission is in flight, abort that submission in the
        engine (``_abort_submission``) before clearing ``st.sub_id``, then re-raise."""
        raise NotImplementedError

    async def _abort_submission(self, sub_id: str) -> None:
        raise NotImplementedError

    async def _pause(self) -> None:
        raise NotImplementedError

    async def _continue(self) -> None:
        raise NotImplementedError

    async def _settle(self) -> None:
        raise NotImplementedError

    def _prepare(self, buckets: Iterable[WeightBucket]) -> Any:
        raise NotImplementedError

    async def _swap(self, prepared: Any, version: int) -> int:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError

    def _capacity_stats(self) -> dict[str, Any]:
        return {"max_seq_len": self.max_model_len}

    # ------------------------------------------------------------------ protocol

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """ADD a request; resolves when it stops, hits a length limit or is aborted."""
        if self._closed:
            raise RollartError(f"engine {self.ENGINE!r} is shut down; create a new engine")
        self._check(request)
        st = self._new_request(request)
        self._reqs[request.request_id] = st
        try:
            # A caller that gives up must not leave its request decoding in the engine:
            # _drive aborts its submission in flight when cancelled (it alone knows it).
            reason = await self._drive(st)
        finally:
            self._reqs.pop(request.request_id, None)
        return st.result(reason, self._name)

    async def abort(self, request_id: str) -> bool:
        """ABORT: True when the request was waiting or running (it returns "abort")."""
        st = self._reqs.get(request_id)
        if st is None or st.aborted:
            return False
        st.aborted = True
        self._aborted_total += 1
        st.wake.set()
        if st.sub_id is not None:
            await self._abort_submission(st.sub_id)
        return True

    async def suspend(self) -> None:
        """Hold new requests here; pause in-flight ones inside the engine (KV kept).

        A :meth:`resume` that arrives while the engine is still pausing wins: on Ray a
        driver that gave up on its suspend (a stop cancelling a weight swap) does not
        stop the call on the actor, and its ``resume`` can run there in the middle of it.
        Without this check the pause would land after the resume and leave the engine
        paused with nobody to resume it."""
        if self._suspended:
            return
        self._suspended = True
        await self._pause()
        if not self._suspended:  # resumed while pausing: undo the pause
            await self._continue()
            return
        await self._settle()

    async def resume(self) -> None:
        if not self._suspended:
            return
        self._suspended = False
        await self._continue()
        for st in list(self._reqs.values()):
            st.wake.set()

    async def load_weights(self, buckets: Iterable[WeightBucket], version: int) -> int:
        """Check and convert ``buckets`` off the event loop (reading them may block on a
        pull transport), then ``_swap`` them in; one update at a time. Returns how many
        in-flight requests were resubmitted."""
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        async with self._update_lock:
            prepared = await asyncio.to_thread(self._prepare, buckets)
            return await self._swap(prepared, version)

    async def commit_direct(self, version: int) -> int:
        """The collective path (``rollart_sdk.weights.direct``): swap in the version the
        engine's workers staged (``_swap`` gets a :class:`StagedVersion`)."""
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        async with self._update_lock:
            return await self._swap(StagedVersion(int(version)), version)

    def stats(self) -> dict[str, Any]:
        running = sum(1 for st in self._reqs.values() if st.sub_id is not None)
        return {
            "running": running,
            "waiting": len(self._reqs) - running,
            "version": self._version,
            "tokens_generated": self._tokens_generated,
            "steps": self._outputs,  # stream outputs received (the engine's steps are internal)
            "suspended": self._suspended,
            "recomputed": self._recomputed_total,
            "aborted": self._aborted_total,
            **self._capacity_stats(),
            "prompt_tokens": self._prompt_tokens,
            "prefix_cached_tokens": self._cached_tokens,
        }

    async def shutdown(self) -> None:
        """Abort everything still queued or running and stop the engine."""
        if self._closed:
            return
        self._closed = True
        try:
            for st in list(self._reqs.values()):
                await self.abort(st.request.request_id)
            await self.resume()
            await self._wait_finished(list(self._reqs.values()), timeout=self.SHUTDOWN_WAIT_S)
        except TimeoutError:  # a submission that does not end: stop the engine anyway
            log.warning("engine adapter: %d request(s) still running %g s after their "
                        "abort at shutdown; stopping the engine regardless",
                        sum(1 for st in self._reqs.values() if st.sub_id is not None),
                        self.SHUTDOWN_WAIT_S)
        finally:
            await self._close()

    # ------------------------------------------------------------------ helpers

    async def _wait_finished(self, states: list[R],
                             timeout: float | None = None) -> None:
        """Until the submission in flight of each of ``states`` has ended."""
        pending = [st.finished.wait() for st in states if st.sub_id is not None]
        if pending:
            await asyncio.wait_for(asyncio.gather(*pending), timeout)

    async def _next_submission(self, st: AdapterRequest) -> FinishReason | list[int]:
        """Wait while suspended; then "abort" or "length" when ``st`` ends here, else the
        context (prompt + tokens so far) of its next submission, with ``attempt``,
        ``sub_id`` and ``finished`` set for it."""
        while True:
            if st.aborted:
                return "abort"
            if self._suspended:  # held here: the engine never sees it while suspended
                st.wake.clear()
                await st.wake.wait()
                continue
            context = [*st.request.prompt_ids, *st.out_ids]
            if self._remaining(st) <= 0 or len(context) >= self.max_model_len:
                return "length"
            st.attempt += 1
            st.sub_id = f"{st.request.request_id}#{st.attempt}"
            st.finished.clear()
            return context

    def _remaining(self, st: AdapterRequest) -> int:
        return st.request.sampling.max_new_tokens - len(st.out_ids)

    def _max_tokens(self, st: AdapterRequest) -> int:
        """New tokens to ask of the next submission: the rest of ``max_new_tokens``, within
        the context left (at least 1)."""
        room = self.max_model_len - len(st.request.prompt_ids) - len(st.out_ids)
        return max(1, min(self._remaining(st), room))

    def _stop_ids(self, st: AdapterRequest) -> list[int]:
        return sorted(set(st.request.sampling.stop_token_ids) | set(self._eos))

    def _check(self, request: GenerationRequest) -> None:
        rid = request.request_id
        if rid in self._reqs:
            raise ValueError(f"request_id {rid!r} is already being generated; ids must be unique")
        check_request(request, vocab_size=self.vocab_size, max_len=self.max_model_len,
                      limit=self.LIMIT_OPTION, hint=self.LIMIT_HINT)
