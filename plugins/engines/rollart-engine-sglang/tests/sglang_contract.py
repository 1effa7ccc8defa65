"""A recorded-contract stand-in for SGLang 0.5.23 (tests only; never shipped).

SGLang 0.5.23 does not run here from the registries (it pins torch 2.14.1 and CUDA
kernels), so the adapter is tested against this stand-in. It reproduces the parts of
0.5.23 the adapter uses, with their exact names and signatures (``test_contract.py``
compares them with the wheel's source) and the behaviour recorded from the real engine:

- ``Engine(**server_args)`` with ``tokenizer_manager``; ``await Engine.async_generate(...,
  stream=True)`` returns an async generator of ``{"output_ids": [...cumulative],
  "meta_info": {"output_token_logprobs": [(logprob, id, None), ...], "finish_reason":
  None | {"type": "stop" | "length" | "abort", ...}, "cached_tokens": n}}``;
- ``tokenizer_manager.abort_request(rid=...)``: a waiting request finishes at once; a
  running one at the next scheduler step (so, while paused in place, not until
  ``continue_generation``);
- ``pause_generation(PauseGenerationReqInput(mode=...))``: ``in_place`` freezes the batch
  with its KV; ``retract`` moves running requests back to the waiting queue (KV freed);
- ``pause_generation`` only sends the pause to the scheduler (the real one takes effect
  later); ``get_internal_state()`` is a scheduler round trip answered after it;
- ``flush_cache()`` fails while requests are in the running batch;
- ``update_weights_from_tensor`` outside ``begin_weight_update`` / ``end_weight_update``
  answers ``(False, message)``;
- log-probs without ``SGLANG_RETURN_ORIGINAL_LOGPROB`` (SGLang's default): ``log_softmax``
  of the logits after ``logit_bias`` divided by the temperature (a greedy request runs at
  temperature 1 with top-k 1, ``sampling_params.py``); top-k/top-p do not enter the
  log-probs (``sampler.py``: ``torch.log(probs)`` of the tempered softmax, before the
  filters); ``token_ids_logprob=[ids]`` adds
  ``meta_info["output_token_ids_logprobs"]``: per output position, ``(logprob, id, None)``
  for each requested id, from the same log-probs.

Generation itself is a plain forward pass of the HF checkpoint (no KV cache), one token
per running request per scheduler step.
"""

from __future__ import annotations

import asyncio
import io
import os
import pickle
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Any, Literal

import torch

# ----------------------------------------------------------------- io_struct (0.5.23 names)


@dataclass(kw_only=True)
class PauseGenerationReqInput:
    mode: Literal["abort", "retract", "in_place"] = "abort"


@dataclass(kw_only=True)
class ContinueGenerationReqInput:
    torch_empty_cache: bool = True


@dataclass(kw_only=True)
class BeginWeightUpdateReqInput:
    selector: Literal["target", "draft", "all"] = "all"


@dataclass(kw_only=True)
class EndWeightUpdateReqInput:
    pass


@dataclass(kw_only=True)
class UpdateWeightsFromTensorReqInput:
    serialized_named_tensors: list[bytes]
    load_format: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False


@dataclass(kw_only=True)
class RpcReqInput:
    method: str
    parameters: dict[str, Any] | None = None


@dataclass(kw_only=True)
class RpcReqOutput:
    success: bool
    message: str


@dataclass(kw_only=True)
class FlushCacheReqOutput:
    success: bool
    message: str = ""


class MultiprocessingSerializer:
    @staticmethod
    def serialize(obj: Any, output_str: bool = False) -> bytes:
        buf = io.BytesIO()
        ForkingPickler(buf).dump(obj)
        return buf.getvalue()

    @staticmethod
    def deserialize(data: bytes) -> Any:
        return pickle.loads(data)


# ----------------------------------------------------------------- the engine


@dataclass(eq=False)
class _Req:
    rid: str
    input_ids: list[int]
    params: dict[str, Any]
    out: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    token_ids_logprob: list[int] | None = None
    ids_lps: list[list[tuple[float, int, None]]] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    to_abort: bool = False
    gen: torch.Generator = field(default_factory=torch.Generator)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class TokenizerManager:
    def __init__(self, model: Any, vocab: int, step_s: float) -> None:
        self.model = model
        self.vocab = vocab
        self.step_s = step_s
        self.rid_to_state: dict[str, _Req] = {}
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self.is_pause = False
        self.session_open = False
        self.calls: list[str] = []  # control calls in order (the tests read them)
        self._loop_task: asyncio.Task[None] | None = None

    # -- requests
    async def generate_request(self, obj: dict[str, Any], request: Any = None):
        req = _Req(obj["rid"], list(obj["input_ids"]), dict(obj["sampling_params"] or {}),
                   token_ids_logprob=obj.get("token_ids_logprob"))
        seed = req.params.get("sampling_seed")
        req.gen.manual_seed(int(seed) if seed is not None else hash(req.rid) % (1 << 31))
        self.rid_to_state[req.rid] = req
        self.waiting.append(req)
        self._start()
        sent = -1
        while True:
            await req.changed.wait()
            req.changed.clear()
            if len(req.out) != sent or req.finish:
                sent = len(req.out)
                meta: dict[str, Any] = {
                    "id": req.rid,
                    "output_token_logprobs": [(lp, t, None) for lp, t in zip(req.lps, req.out, strict=True)],
                    "finish_reason": req.finish,
                    "cached_tokens": 0,
                }
                if req.token_ids_logprob is not None:
                    meta["output_token_ids_logprobs"] = list(req.ids_lps)
                yield {"output_ids": list(req.out), "meta_info": meta}
            if req.finish:
                self.rid_to_state.pop(req.rid, None)
                return

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.calls.append("abort_request")
        for req in list(self.waiting):
            if abort_all or req.rid.startswith(rid) and rid:
                self.waiting.remove(req)
                self._finish(req, {"type": "abort", "message": "aborted"})
        for req in self.running:
            if abort_all or req.rid.startswith(rid) and rid:
                req.to_abort = True  # processed at the next scheduler step

    # -- control
    async def pause_generation(self, obj: PauseGenerationReqInput) -> None:
        self.calls.append(f"pause_generation:{obj.mode}")
        assert obj.mode in ("in_place", "retract"), "abort mode is not used by the adapter"
        self.is_pause = True
        if obj.mode == "retract":
            self.waiting = self.running + self.waiting
            self.running = []

    async def get_internal_state(self) -> list[dict[str, Any]]:
        # In 0.5.23 a scheduler round trip; pause_generation does not wait for the scheduler,
        # the adapter awaits this after it so that the pause has taken effect.
        self.calls.append("get_internal_state")
        return [{}]

    async def continue_generation(self, obj: ContinueGenerationReqInput) -> None:
        self.calls.append("continue_generation")
        self.is_pause = False

    async def begin_weight_update(self, obj: BeginWeightUpdateReqInput, request: Any = None):
        self.calls.append("begin_weight_update")
        self.session_open = True
        return True, ""

    async def end_weight_update(self, obj: EndWeightUpdateReqInput, request: Any = None):
        self.calls.append("end_weight_update")
        ok = self.session_open
        self.session_open = False
        return ok, "" if ok else "no weight update session is open"

    async def update_weights_from_tensor(self, obj: UpdateWeightsFromTensorReqInput,
                                         request: Any = None):
        self.calls.append("update_weights_from_tensor")
        if not self.session_open:
            return False, "weight updates must run between begin_weight_update and end_weight_update"
        named = MultiprocessingSerializer.deserialize(obj.serialized_named_tensors[0])
        state = self.model.state_dict()
        for name, tensor in named:
            if name not in state or state[name].shape != tensor.shape:
                return False, f"bad tensor {name}"
            state[name].copy_(tensor)
        return True, "Succeeded to update model weights."

    async def flush_cache(self, timeout_s: float | None = None) -> FlushCacheReqOutput:
        self.calls.append("flush_cache")
        if self.running:
            return FlushCacheReqOutput(success=False, message="running requests hold KV")
        return FlushCacheReqOutput(success=True)

    # -- scheduler
    def _start(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._scheduler())

    def _finish(self, req: _Req, reason: dict[str, Any]) -> None:
        req.finish = reason
        req.changed.set()

    async def _scheduler(self) -> None:
        while self.rid_to_state:
            await asyncio.sleep(self.step_s)
            if self.is_pause:
                continue
            self.running += self.waiting
            self.waiting = []
            for req in list(self.running):
                if req.to_abort:
                    self.running.remove(req)
                    self._finish(req, {"type": "abort", "message": "aborted"})
                    continue
                self._decode(req)
                if req.finish:
                    self.running.remove(req)

    def _decode(self, req: _Req) -> None:
        p = req.params
        with torch.no_grad():
            logits = self.model(torch.tensor([req.input_ids + req.out])).logits[0, -1].float()
        for key, bias in (p.get("logit_bias") or {}).items():
            logits[int(key)] += bias
        temp = float(p.get("temperature", 1.0))
        lp = torch.log_softmax(logits / (temp if temp > 0.0 else 1.0), dim=-1)
        if temp == 0.0:
            tok = int(torch.argmax(logits))
        else:
            probs = torch.softmax(logits / temp, dim=-1)
            k = int(p.get("top_k", 0) or 0)
            if 0 < k < probs.numel():
                kth = torch.topk(probs, k).values[-1]
                probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
            top_p = float(p.get("top_p", 1.0))
            if top_p < 1.0:
                sp, idx = torch.sort(probs, descending=True)
                keep = torch.cumsum(sp, 0) - sp < top_p * sp.sum()
                mask = torch.zeros_like(probs, dtype=torch.bool)
                mask[idx[keep]] = True
                probs = torch.where(mask, probs, torch.zeros_like(probs))
            tok = int(torch.multinomial(probs / probs.sum(), 1, generator=req.gen))
        req.out.append(tok)
        req.lps.append(float(lp[tok]))
        if req.token_ids_logprob is not None:
            req.ids_lps.append([(float(lp[i]), i, None) for i in req.token_ids_logprob])
        if tok in set(p.get("stop_token_ids") or ()):
            req.finish = {"type": "stop", "matched": tok}
        elif len(req.out) >= int(p.get("max_new_tokens", 128)):
            req.finish = {"type": "length", "length": len(req.out)}
        req.changed.set()


class Engine:
    """``sglang.Engine`` as the adapter uses it (in-process, async calls only)."""

    instances: list[Engine] = []

    def __init__(self, **kwargs: Any) -> None:
        from rollart_sdk.models import load_causal_lm

        assert os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB") == "0", (
            "the adapter must set SGLANG_RETURN_ORIGINAL_LOGPROB=0 before the engine starts"
        )
        self.server_args = kwargs
        model = load_causal_lm(kwargs["model_path"])
        self.tokenizer_manager = TokenizerManager(model, model.config.vocab_size, 0.002)
        self.shut = False
        Engine.instances.append(self)

    async def async_generate(self, prompt: Any = None, sampling_params: Any = None,
                             input_ids: Any = None, *args: Any, return_logprob: Any = False,
                             stream: bool = False, rid: Any = None,
                             token_ids_logprob: Any = None, **kwargs: Any) -> Any:
        assert input_ids is not None and prompt is None and return_logprob and stream
        gen = self.tokenizer_manager.generate_request(
            {"rid": rid, "input_ids": input_ids, "sampling_params": sampling_params,
             "token_ids_logprob": token_ids_logprob}, None
        )
        return gen

    def shutdown(self) -> None:
        self.shut = True
