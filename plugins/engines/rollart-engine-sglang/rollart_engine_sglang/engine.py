"""Engine ``sglang``: SGLang's in-process ``Engine`` behind ``InferenceEngine``.

Written against SGLang 0.5.23's signatures (read from its wheel; ``tests/test_contract.py``
checks them against the wheel's source). The adapter is async, so it calls the
``TokenizerManager`` coroutines the ``Engine``'s blocking wrappers would run on their own
loop:

- ADD: ``Engine.async_generate(input_ids=..., sampling_params=..., return_logprob=True,
  stream=True, rid=...)``. Log-probs are those of the sampled policy,
  ``log_softmax(logits / T)`` (:mod:`rollart_sdk.algorithms.policy`): SGLang's default, so
  the engine process runs with ``SGLANG_RETURN_ORIGINAL_LOGPROB=0`` (set explicitly: with
  1 it would report the raw logits' ones). SGLang has no ``allowed_token_ids`` (and a
  ``logit_bias`` would change the log-probs it reports): a constrained request runs one
  token per SGLang request, with ``token_ids_logprob`` = the allowed ids, and the adapter
  samples among them and reports the masked, tempered log-prob (``constrained.py``).
- ABORT: ``tokenizer_manager.abort_request(rid=...)``.
- suspend / resume: new requests are held here; in-flight ones are paused inside SGLang
  with ``pause_generation(PauseGenerationReqInput(mode="in_place"))`` (KV kept) and
  continue on ``continue_generation(ContinueGenerationReqInput())``.

What happens to an in-flight request at a weight update (paper step 5), in one place
(``load_weights``): ``pause_generation(mode="retract")`` moves every running request back
to SGLang's waiting queue and frees its KV (``flush_cache`` fails while requests run);
each is then ABORTED and RESUBMITTED after the swap with the tokens it generated so far
appended to its prompt. The trajectory continues (tokens, logprobs and versions kept;
only the remaining ``max_new_tokens`` asked for) and its prefix is prefilled again under
the new weights: that is the KV recomputation. Abort-and-resubmit rather than SGLang's
own resume-after-retract because it tells exactly which tokens the old weights made.
The weights go in between ``begin_weight_update`` and ``end_weight_update`` (SGLang
0.5.23 refuses updates outside that session), one ``update_weights_from_tensor`` per
bucket, then ``flush_cache``.

The collective path (``rollart_sdk.weights.direct``): with a push transport that offers it
(``nccl``), SGLang's scheduler process receives each round itself into a staging buffer
(``scheduler.py``, loaded there as an SGLang plugin; driven by RPCs, ``collective.py``),
the staged version is checked against the checkpoint before anything is aborted, and the
swap loads it in one ``load_weights`` call through a custom weight loader inside the same
weight-update session. Every other transport, a LoRA adapter payload and ``tp_size`` > 1
keep the tensor path above (the bytes path).

The engine-independent bookkeeping (request states, ABORT, suspend / resume, stats,
shutdown, bucket checks) is :mod:`rollart_sdk.backends.engine_adapter`, shared with engine
``vllm``; this module holds the SGLang calls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from rollart_engine_sglang.collective import SchedulerRpc
from rollart_engine_sglang.constrained import (
    allowed_logprobs,
    allowed_policy_logprob,
    choose_allowed,
)
from rollart_engine_sglang.scheduler import LOADER, MARKER
from rollart_sdk.backends.engine_adapter import (
    AdapterRequest,
    EngineAdapter,
    StagedVersion,
    checkpoint_shapes,
    convert_buckets,
    eos_ids,
    submission_seed,
)
from rollart_sdk.config import ModelConfig
from rollart_sdk.errors import RollartError
from rollart_sdk.types import FinishReason, GenerationRequest, WeightBucket, WeightManifest
from rollart_sdk.weights.direct import manifest_to_json
from rollart_sdk.weights.lora import CheckpointBase, is_adapter_name

log = logging.getLogger(__name__)
SETTLE_QUIET_S = 0.05  # no stream chunk for this long after a pause: the last step arrived
SETTLE_MAX_S = 2.0


@dataclass(eq=False)
class _Request(AdapterRequest):
    """An :class:`~rollart_sdk.backends.engine_adapter.AdapterRequest` (``sub_id``: the SGLang rid
    in flight) that may be constrained to ``allowed_token_ids``."""

    allowed: list[int] | None = None  # sorted allowed ids: sampled here (constrained.py)
    generator: torch.Generator | None = None


def _check_ok(what: str, answer: Any) -> None:
    """SGLang control calls answer ``(success, message)`` or an object with ``success``."""
    if isinstance(answer, tuple):
        ok, message = bool(answer[0]), str(answer[1]) if len(answer) > 1 else ""
    else:
        ok, message = bool(getattr(answer, "success", False)), str(getattr(answer, "message", ""))
    if not ok:
        raise RollartError(f"engine 'sglang': {what} failed: {message or answer!r}")


class SglangEngine(EngineAdapter[_Request]):
    """A :class:`rollart_sdk.interfaces.InferenceEngine` on SGLang's ``Engine``.

    Options are documented on :class:`rollart_engine_sglang.options.SglangEngineOptions`.
    ``engine_factory`` (tests only) replaces ``sglang.Engine``.
    """

    ENGINE = "sglang"
    LIMIT_OPTION = "context_length"

    def __init__(
        self,
        model: ModelConfig,
        device: str = "cuda",
        dtype: str = "auto",
        context_length: int | None = None,
        max_running_requests: int = 64,
        enable_prefix_caching: bool = True,
        mem_fraction_static: float | None = None,
        max_total_tokens: int | None = None,
        tp_size: int = 1,
        attention_backend: str | None = None,
        seed: int = 0,
        eos_token_ids: list[int] | None = None,
        deterministic_inference: bool = False,
        engine_factory: Any = None,
    ) -> None:
        if model.path is None:
            raise RollartError(
                "engine 'sglang' needs a prepared model with model.path set (an HF "
                "checkpoint folder); the pipeline prepares model.tiny and model.gguf into one"
            )
        # Read by SGLang's sampler at import, in the scheduler process it spawns: 0 keeps
        # SGLang's default, log-probs of the tempered distribution (the sampled policy).
        os.environ["SGLANG_RETURN_ORIGINAL_LOGPROB"] = "0"
        if device == "cpu":
            os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
            attention_backend = attention_backend or "torch_native"
        if engine_factory is None:
            try:
                import sglang
            except ImportError as exc:
                raise RollartError(
                    f"engine 'sglang' needs SGLang 0.5.23 ({exc}); install it with `pip "
                    "install 'rollart-engine-sglang[gpu]'` on a CUDA machine (see the "
                    "plugin README for what runs on CPU)"
                ) from exc
            engine_factory = sglang.Engine
        from sglang.srt.managers.io_struct import (
            BeginWeightUpdateReqInput,
            ContinueGenerationReqInput,
            EndWeightUpdateReqInput,
            PauseGenerationReqInput,
            UpdateWeightsFromTensorReqInput,
        )

        self._io = {
            "begin": BeginWeightUpdateReqInput,
            "end": EndWeightUpdateReqInput,
            "pause": PauseGenerationReqInput,
            "continue": ContinueGenerationReqInput,
            "tensor": UpdateWeightsFromTensorReqInput,
        }
        kwargs: dict[str, Any] = dict(
            model_path=model.path,
            dtype=model.dtype if dtype == "auto" else dtype,
            max_running_requests=max_running_requests,
            disable_radix_cache=not enable_prefix_caching,
            tp_size=tp_size,
            random_seed=seed,
            device=device,
            log_level="error",
            # the collective path's commit (scheduler.py): load_format=LOADER
            custom_weight_loader=[LOADER],
        )
        if deterministic_inference:
            kwargs["enable_deterministic_inference"] = True
        for key, value in (("context_length", context_length),
                           ("mem_fraction_static", mem_fraction_static),
                           ("max_total_tokens", max_total_tokens),
                           ("attention_backend", attention_backend)):
            if value is not None:
                kwargs[key] = value
        self._engine = engine_factory(**kwargs)
        self._tm = self._engine.tokenizer_manager
        self._device = device
        self._tp = tp_size
        self._checkpoint = model.path
        self._shapes = checkpoint_shapes(model.path)
        self._rpc = SchedulerRpc(self._engine)
        self.direct_unavailable = self._rpc.available() if tp_size == 1 else "tp_size > 1"
        if self.direct_unavailable is not None:
            log.info("engine 'sglang': weights take the bytes path with every transport "
                     "(the collective path needs this plugin in SGLang's scheduler: %s)",
                     self.direct_unavailable)
        # LoRA payloads are merged against the checkpoint's own tensors (convert_buckets)
        self._base = CheckpointBase(model.path)
        import transformers

        hf = transformers.AutoConfig.from_pretrained(model.path)
        self.vocab_size = int(hf.vocab_size)
        self.max_model_len = int(
            context_length or getattr(hf, "max_position_embeddings", 0) or 2048
        )
        self._eos = eos_ids(hf, eos_token_ids)
        # SGLang 0.5.23 uses a request's sampling_seed only under
        # enable_deterministic_inference (GPU attention backends only); said once.
        self._seeds_honoured = deterministic_inference
        self._seed_warned = False
        self._init_adapter(f"sglang-engine:{model.path}")

    # ------------------------------------------------------------------ engine calls

    def _new_request(self, request: GenerationRequest) -> _Request:
        st = _Request(request)
        sp = request.sampling
        if sp.allowed_token_ids is not None:
            st.allowed = sorted(set(sp.allowed_token_ids))
            st.generator = torch.Generator()
            if sp.seed is not None:
                st.generator.manual_seed(sp.seed % (1 << 63))
            else:
                st.generator.seed()
        return st

    async def _abort_submission(self, sub_id: str) -> None:
        self._tm.abort_request(rid=sub_id)

    async def _pause(self) -> None:
        await self._tm.pause_generation(self._io["pause"](mode="in_place"))

    async def _continue(self) -> None:
        await self._tm.continue_generation(
            self._io["continue"](torch_empty_cache=self._device == "cuda")
        )

    def _prepare(self, buckets: Iterable[WeightBucket]) -> list[list[tuple[str, Any]]]:
        """Every bucket's (name, tensor) list, checked against the served checkpoint first
        so that a bad or partial transfer raises before SGLang is touched."""
        return convert_buckets(buckets, self._shapes,
                               lambda b: [(k, v.contiguous()) for k, v in b.tensors.items()],
                               self._base)

    # ------------------------------------------------------------------ collective path

    def receives_directly(self, manifest: WeightManifest) -> bool:
        """SGLang's scheduler receives the round itself (``scheduler.py``), when this
        plugin is loaded there, ``tp_size`` is 1 (the control plane counts one receiver
        per engine) and the version is not a LoRA adapter payload (merged here)."""
        return self.direct_unavailable is None and not any(
            is_adapter_name(n) for ref in manifest.buckets for n in ref.names)

    async def stage_direct(self, manifest: WeightManifest, spec: dict[str, Any]) -> None:
        await self._rpc.acall("rollart_stage", manifest=manifest_to_json(manifest),
                              spec=json.dumps(spec))

    async def direct_status(self) -> dict[str, Any]:
        status: dict[str, Any] = await self._rpc.acall("rollart_status")
        return status

    async def cancel_direct(self, version: int) -> None:
        await self._rpc.acall("rollart_cancel", version=int(version))

    # ------------------------------------------------------------------ the swap

    async def _swap(self, prepared: list[list[tuple[str, Any]]] | StagedVersion,
                    version: int) -> int:
        """Retract, abort the in-flight requests (``_drive`` resubmits them), load
        ``prepared`` in one weight-update session, flush the cache, set ``version``.
        Returns how many requests were moved. On the collective path the staged version
        is checked in the scheduler first, before anything is aborted."""
        if isinstance(prepared, StagedVersion):
            await self._rpc.acall("rollart_check", version=prepared.version,
                                  checkpoint=self._checkpoint)
        was_suspended = self._suspended
        self._suspended = True
        try:
            moved = await self._retract()
            await self._load(prepared)
            _check_ok("flush_cache", await self._tm.flush_cache())
            self._version = int(version)  # _drive counts each request's KV rebuild
        finally:
            # on failure the weights are the old ones and the moved requests go on there
            self._suspended = was_suspended
            if not was_suspended:
                self._suspended = True  # resume() flips it and wakes the held requests
                await self.resume()
        return len(moved)

    async def _retract(self) -> list[_Request]:
        """Running requests back to SGLang's waiting queue (KV freed, so that the aborts
        land at once and ``flush_cache`` is allowed), then every in-flight one aborted
        and marked for resubmission; returns them."""
        await self._tm.pause_generation(self._io["pause"](mode="retract"))
        # In flight: started and not finished (a constrained request between two of
        # its one-token submissions too); requests held since a suspend() before they
        # started are not.
        moved = [st for st in self._reqs.values() if st.attempt > 0 and not st.aborted]
        for st in moved:
            st.resubmit = True
            if st.sub_id is not None:
                self._tm.abort_request(rid=st.sub_id)
        await self._wait_finished(moved)
        return moved

    async def _load(self, prepared: list[list[tuple[str, Any]]] | StagedVersion) -> None:
        """One weight-update session: ``update_weights_from_tensor`` per bucket (the bytes
        path), or once with ``load_format=LOADER`` and the version as its one tensor (the
        collective path: the scheduler loads what it staged and checked)."""
        _check_ok("begin_weight_update",
                  await self._tm.begin_weight_update(self._io["begin"](), None))
        try:
            if isinstance(prepared, StagedVersion):
                await self._update_tensors([(MARKER, torch.tensor([prepared.version]))],
                                           LOADER)
            else:
                for tensors in prepared:
                    await self._update_tensors(tensors, None)
        finally:
            _check_ok("end_weight_update",
                      await self._tm.end_weight_update(self._io["end"](), None))
        if isinstance(prepared, StagedVersion):
            await self._rpc.acall("rollart_result", version=prepared.version)

    async def _update_tensors(self, tensors: list[tuple[str, Any]],
                              load_format: str | None) -> None:
        from sglang.srt.utils.common import MultiprocessingSerializer

        payload = [MultiprocessingSerializer.serialize(tensors) for _ in range(self._tp)]
        _check_ok("update_weights_from_tensor", await self._tm.update_weights_from_tensor(
            self._io["tensor"](serialized_named_tensors=payload, flush_cache=False,
                               load_format=load_format),
            None,
        ))

    async def _close(self) -> None:
        await asyncio.to_thread(self._engine.shutdown)

    # ------------------------------------------------------------------ internals

    async def _settle(self) -> None:
        """Return once the scheduler has stopped and its last outputs have arrived.

        SGLang 0.5.23's ``pause_generation`` only sends the pause to the scheduler (it does
        not wait for it), and token outputs reach the streams through the detokenizer
        process. So: a ``get_internal_state`` round trip, which the scheduler answers after
        it has handled the pause sent before it (one ordered socket); then wait until no
        stream chunk has arrived for ``SETTLE_QUIET_S`` (the outputs of the scheduler's
        last step before the pause, still in the detokenizer), at most ``SETTLE_MAX_S``.
        """
        await self._tm.get_internal_state()
        loop = asyncio.get_running_loop()
        end = loop.time() + SETTLE_MAX_S
        while loop.time() < end:
            seen = self._outputs
            await asyncio.sleep(SETTLE_QUIET_S)
            if self._outputs == seen:
                return

    async def _drive(self, st: _Request) -> FinishReason:
        """Submit ``st`` to SGLang until it finishes: once (plus once per weight update it
        spans, resubmitted with its tokens so far), or once per token when constrained."""
        sp = st.request.sampling
        stops = set(sp.stop_token_ids) | set(self._eos)
        while True:
            context = await self._next_submission(st)
            if not isinstance(context, list):
                return context
            st.resubmit = False
            version = self._version
            if st.versions and st.versions[-1] != version:
                # Weights changed since this request's last token: its prefix (prompt +
                # tokens so far) is prefilled again under the new weights.
                st.recomputed += 1
                self._recomputed_total += 1
            try:
                reason = await self._submit(st, context, version)
            except asyncio.CancelledError:
                st.aborted = True
                self._tm.abort_request(rid=st.sub_id)  # the caller gave up: free SGLang's slot
                raise
            finally:
                st.sub_id = None
                st.finished.set()
            if reason == "abort":
                if st.resubmit and not st.aborted:
                    continue  # aborted by load_weights: continue under the new weights
                return "abort"
            if st.allowed is None:
                return reason  # type: ignore[return-value]
            if st.out_ids and st.out_ids[-1] in stops:
                return "stop"
            # constrained: next token (the loop's top ends it at max_new_tokens)

    async def _submit(self, st: _Request, context: list[int], version: int) -> str | None:
        """One SGLang request for ``st``; returns its finish reason (None: stream ended
        without one). Unconstrained: its tokens and log-probs are appended as they stream.
        Constrained: one token, sampled here among the allowed ids from their
        full-vocabulary log-probs (``constrained.py``)."""
        extra: dict[str, Any] = {}
        if st.allowed is not None:
            extra["token_ids_logprob"] = list(st.allowed)
        reason: str | None = None
        seen = 0
        first = True
        stream = await self._engine.async_generate(
            input_ids=context,
            sampling_params=self._sampling(st),
            return_logprob=True,
            stream=True,
            rid=st.sub_id,
            **extra,
        )
        async for chunk in stream:
            self._outputs += 1
            meta = chunk.get("meta_info", {})
            if first:
                first = False
                self._prompt_tokens += len(context)
                self._cached_tokens += int(meta.get("cached_tokens", 0) or 0)
            fin = meta.get("finish_reason")
            if fin:
                reason = fin.get("type") if isinstance(fin, dict) else str(fin)
            if st.allowed is not None:
                if seen == 0 and reason != "abort":
                    lps = allowed_logprobs(meta, st.allowed)
                    if lps is not None:
                        assert st.generator is not None
                        i = st.allowed.index(choose_allowed(lps, st.allowed, st.request.sampling,
                                                            st.generator))
                        st.out_ids.append(st.allowed[i])
                        st.logprobs.append(lps[i] if st.request.sampling.raw_logprobs
                                           else allowed_policy_logprob(
                                               lps, i, st.request.sampling.temperature))
                        st.versions.append(version)
                        self._tokens_generated += 1
                        seen = 1
                continue
            ids = list(chunk.get("output_ids") or [])  # cumulative per submission
            lps_out = meta.get("output_token_logprobs") or []
            for i in range(seen, min(len(ids), len(lps_out))):
                st.out_ids.append(int(ids[i]))
                st.logprobs.append(float(lps_out[i][0]))
                st.versions.append(version)
            self._tokens_generated += max(0, min(len(ids), len(lps_out)) - seen)
            seen = max(seen, min(len(ids), len(lps_out)))
        if st.allowed is not None and reason != "abort" and seen == 0:
            raise RollartError(
                f"engine 'sglang': request {st.sub_id!r} finished ({reason}) without the "
                "token_ids_logprob of its allowed ids; cannot sample the constrained token"
            )
        return reason

    def _check(self, request: GenerationRequest) -> None:
        super()._check(request)
        sp = request.sampling
        if sp.raw_logprobs and not sp.allowed_token_ids and sp.temperature not in (0.0, 1.0):
            raise RollartError(
                "engine 'sglang' reports tempered log-probs for an unconstrained request: "
                "raw_logprobs needs temperature 0 or 1 there (or allowed_token_ids)"
            )

    def _sampling(self, st: _Request) -> dict[str, Any]:
        sp = st.request.sampling
        if st.allowed is not None:
            # One step whose token SGLang discards (chosen here): greedy, no stop, no seed.
            return {"temperature": 0.0, "max_new_tokens": 1, "ignore_eos": True}
        params: dict[str, Any] = {
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "max_new_tokens": self._max_tokens(st),
            "stop_token_ids": self._stop_ids(st),
        }
        if sp.top_k > 0:
            params["top_k"] = sp.top_k
        if sp.seed is not None:
            if not self._seeds_honoured and not self._seed_warned:
                self._seed_warned = True
                log.warning(
                    "engine 'sglang': requests carry seeds, but SGLang 0.5.23 ignores "
                    "sampling_seed unless deterministic_inference is on (GPU attention "
                    "backends only); seeded requests are not reproducible on this engine "
                    "(constrained ones are: their tokens are sampled by the adapter)"
                )
            params["sampling_seed"] = (
                submission_seed(sp.seed, st.attempt, len(st.out_ids)) % (1 << 63)
            )
        return params
