"""Inference engine ``example``: continuous batching over a bigram "model".

The model is one ``[vocab, vocab]`` table of logits (the next token depends on the last
one), small enough to read whole, yet the engine does everything the control plane relies
on (``rollart_sdk.interfaces.InferenceEngine``): requests join and leave the running batch
at every step, each with its own seeded generator; ``suspend`` pauses, ``abort`` returns the
tokens so far, ``load_weights`` swaps the table in place and in-flight requests continue
(their "KV cache" is rebuilt: counted in ``recomputed``), every token carries the version
that produced it and its log-prob under the sampled policy (temperature and allowed ids,
``rollart_sdk.algorithms.policy_logprob``: what trainers recompute). Replace the table with
your model; ``tests/test_example.py`` runs rollart's conformance kit (``check_engine``).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from rollart_sdk.algorithms import policy_logprob
from rollart_sdk.types import FinishReason, GenerationRequest, GenerationResult, WeightBucket


class ExampleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    vocab_size: int = Field(64, ge=2, description="tokens in the bigram table")
    seed: int = Field(0, description="seed of the initial table")
    step_delay_s: float = Field(0.001, ge=0, description="pause per batch step (lets a "
                                "small machine interleave other work)")


def initial_table(vocab_size: int, seed: int) -> torch.Tensor:
    return torch.randn(vocab_size, vocab_size, generator=torch.Generator().manual_seed(seed))


def bigram_logits(table: torch.Tensor, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Teacher-forced logits ``[len(tokens), vocab]`` that predict each of ``tokens``
    after ``prompt`` (the kit's ``reference_logits``)."""
    return torch.stack([table[t] for t in ([prompt[-1]] + list(tokens))[: len(tokens)]])


@dataclass
class _Seq:
    request: GenerationRequest
    future: asyncio.Future[GenerationResult]
    gen: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    recomputed: int = 0


class ExampleEngine:
    def __init__(self, model: Any = None, vocab_size: int = 64, seed: int = 0,
                 step_delay_s: float = 0.001) -> None:
        self.table = initial_table(vocab_size, seed)
        self.vocab = vocab_size
        self.step_delay_s = step_delay_s
        self.version = 0
        self._waiting: list[_Seq] = []
        self._running: dict[str, _Seq] = {}
        self._suspended = False
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._tokens = 0
        self._steps = 0

    # -- the protocol -----------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        seed = request.sampling.seed
        if seed is None:
            seed = zlib.crc32(request.request_id.encode())
        seq = _Seq(request, asyncio.get_running_loop().create_future(),
                   torch.Generator().manual_seed(seed))
        self._waiting.append(seq)
        self._kick()
        return await seq.future

    async def abort(self, request_id: str) -> bool:
        for seq in [*self._waiting, *self._running.values()]:
            if seq.request.request_id == request_id:
                self._finish(seq, "abort")
                return True
        return False

    async def suspend(self) -> None:
        self._suspended = True

    async def resume(self) -> None:
        self._suspended = False
        self._kick()

    async def load_weights(self, buckets: Iterable[WeightBucket], version: int) -> int:
        for bucket in buckets:
            if "table" in bucket.tensors:
                self.table = bucket.tensors["table"].detach().clone().float()
        self.version = version
        for seq in self._running.values():  # in flight: continue under the new weights
            seq.recomputed += 1
        return len(self._running)

    def stats(self) -> dict[str, Any]:
        return {"running": len(self._running), "waiting": len(self._waiting),
                "version": self.version, "tokens_generated": self._tokens,
                "steps": self._steps}

    async def shutdown(self) -> None:
        for seq in [*self._waiting, *self._running.values()]:
            self._finish(seq, "abort")
        if self._task is not None:
            self._task.cancel()

    # -- the batch loop -----------------------------------------------------------------
    def _kick(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())
        self._wake.set()

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            if self._suspended or not (self._waiting or self._running):
                self._wake.clear()
                await self._wake.wait()
                continue
            for seq in self._waiting:
                self._running[seq.request.request_id] = seq
            self._waiting = []
            for seq in list(self._running.values()):
                self._step(seq)
            self._steps += 1
            await asyncio.sleep(self.step_delay_s)

    def _step(self, seq: _Seq) -> None:
        s = seq.request.sampling
        last = seq.tokens[-1] if seq.tokens else seq.request.prompt_ids[-1]
        logits = self.table[last]
        choice = logits.clone()
        if s.allowed_token_ids is not None:
            mask = torch.full_like(choice, float("-inf"))
            mask[s.allowed_token_ids] = 0.0
            choice = choice + mask
        if s.temperature <= 0:
            token = int(torch.argmax(choice))
        else:
            choice = choice / s.temperature
            if s.top_k > 0:
                kth = torch.topk(choice, min(s.top_k, self.vocab)).values[-1]
                choice = choice.masked_fill(choice < kth, float("-inf"))
            probs = torch.softmax(choice, -1)
            if s.top_p < 1.0:
                sorted_p, order = torch.sort(probs, descending=True)
                drop = torch.cumsum(sorted_p, 0) - sorted_p > s.top_p
                probs[order[drop]] = 0.0
                probs = probs / probs.sum()
            token = int(torch.multinomial(probs, 1, generator=seq.gen))
        seq.tokens.append(token)
        allowed = (torch.tensor(s.allowed_token_ids) if s.allowed_token_ids is not None
                   else None)
        seq.logprobs.append(policy_logprob(logits, token, s.temperature, allowed))
        seq.versions.append(self.version)
        self._tokens += 1
        if token in s.stop_token_ids:
            self._finish(seq, "stop")
        elif len(seq.tokens) >= s.max_new_tokens:
            self._finish(seq, "length")

    def _finish(self, seq: _Seq, reason: FinishReason) -> None:
        self._running.pop(seq.request.request_id, None)
        if seq in self._waiting:
            self._waiting.remove(seq)
        if not seq.future.done():
            seq.future.set_result(GenerationResult(
                seq.request.request_id, list(seq.tokens), list(seq.logprobs),
                list(seq.versions), reason, recomputed=seq.recomputed))
