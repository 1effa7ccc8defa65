"""The templates of the two kinds that run a model, for ``rollart new-plugin``: an engine
(continuous batching over a bigram table of logits, with the engine protocol's seeded
sampling, abort, suspend/resume and weight updates) and a trainer (GRPO + PPO-clip on a
Hugging Face causal LM), each with its test. The light kinds and the package files are in
``plugin_templates``; the placeholders are the same (plain text substitution).
"""

from __future__ import annotations

TRAINER = """\
\"\"\"Trainer ``{name}``: one policy-gradient step per batch on a Hugging Face causal LM.

The smallest trainer that follows ``rollart_sdk.interfaces.Trainer``: GRPO advantages
(computed here, the one place they are: ``rollart_sdk.algorithms.fill_advantages``), the
PPO-clip loss against the engine's behaviour log-probs (``rollart_sdk.algorithms``), Adam,
one process. Replace the model and the loss with yours; ``tests/test_{name}.py`` runs
rollart's conformance kit (``check_trainer``).
\"\"\"

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import AutoModelForCausalLM

from rollart_sdk.algorithms import (
    allowed_groups,
    fill_advantages,
    policy_temperature,
    policy_token_logprobs,
    ppo_clip_loss,
)
from rollart_sdk.types import TrainSample, WeightBucket
from rollart_sdk.weights import split_buckets


class {options}(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-3, gt=0, description="Adam learning rate")
    clip_eps: float = Field(0.2, gt=0, description="PPO clip range")
    seed: int = Field(0, description="torch seed")


class {cls}:
    def __init__(self, model: Any, rank: int = 0, world_size: int = 1,
                 init_method: str | None = None, lr: float = 1e-3, clip_eps: float = 0.2,
                 seed: int = 0) -> None:
        if world_size != 1:
            raise ValueError("trainer {name} runs one rank: set roles.actor_train.workers: 1")
        torch.manual_seed(seed)
        self.model = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.clip_eps = clip_eps
        self.version = 0

    def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        fill_advantages(batch)
        self.model.train()
        self.optimizer.zero_grad()
        total = 0.0
        for s in batch:
            ids = torch.tensor([s.input_ids])
            logits = self.model(input_ids=ids).logits[0, :-1]
            # The policy the engine sampled from: its temperature and allowed ids.
            groups, allowed = allowed_groups([s.allowed_token_ids])
            n = logits.shape[0]
            logp, _ = policy_token_logprobs(
                logits, ids[0, 1:], torch.full((n,), policy_temperature(s.temperature)),
                torch.full((n,), groups[0]) if allowed else None, allowed)
            logp = logp.unsqueeze(0)
            mask = torch.tensor([s.loss_mask[1:]], dtype=torch.float32)
            old = torch.tensor([s.behaviour_logprobs[1:]], dtype=torch.float32)
            adv = torch.tensor([float(s.advantage or 0.0)])
            loss, _ = ppo_clip_loss(logp, old, adv, mask, self.clip_eps)
            (loss / len(batch)).backward()
            total += float(loss.detach()) / len(batch)
        self.optimizer.step()
        self.version += 1
        return {"loss": total}

    def export_weights(self, bucket_bytes: int) -> Iterator[WeightBucket]:
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        yield from split_buckets(state.items(), bucket_bytes, self.version)

    def save_checkpoint(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "version": self.version, "torch_rng": torch.get_rng_state(),
                    "py_rng": random.getstate()}, Path(path) / "trainer.pt")

    def load_checkpoint(self, path: str) -> None:
        state = torch.load(Path(path) / "trainer.pt", weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["py_rng"])

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path)

    def close(self) -> None:
        pass
"""

TRAINER_TEST = """\
import {package}.plugin as plugin
import pytest
import torch
from {package}.{module} import {cls}

from rollart_sdk.algorithms import token_logprobs
from rollart_sdk.config import ModelConfig, TinyModelConfig
from rollart_sdk.models import build_tiny_checkpoint, load_causal_lm
from rollart_sdk.testing.trainer import check_trainer
from rollart_sdk.types import TrainSample


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tiny = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    return ModelConfig(path=build_tiny_checkpoint(tiny, tmp_path_factory.mktemp("tiny")))


def _batch(model):
    \"\"\"Two groups of two trajectories with the starting model's log-probs, as a rollout
    would record them; rewards differ within each group (a learning signal).\"\"\"
    lm = load_causal_lm(model.path)
    batch = []
    for g, (prompt, actions) in enumerate([([5, 6, 7], ([8, 9], [10, 11])),
                                           ([12, 13], ([14, 15, 16], [17, 18, 19]))]):
        for reward, action in zip((1.0, 0.0), actions):
            ids = prompt + list(action)
            with torch.no_grad():
                t = torch.tensor([ids])
                lps = [0.0] + token_logprobs(lm(input_ids=t).logits, t)[0].tolist()
            mask = [0] * len(prompt) + [1] * len(action)
            batch.append(TrainSample(ids, mask, [lp * m for lp, m in zip(lps, mask)],
                                     [-1] * len(prompt) + [0] * len(action), reward, f"g{g}"))
    return batch


def test_conforms(model):
    report = check_trainer(lambda: {cls}(model=model, lr=1e-2), _batch(model),
                           bucket_bytes=8192)
    assert report["loss_after"] < report["loss_before"]


def test_registers(register_plugin, model):
    desc = register_plugin(plugin).registry.get("trainer", "{name}")
    assert desc.create({"lr": 0.01}, model=model, rank=0, world_size=1).version == 0
"""

ENGINE = """\
\"\"\"Inference engine ``{name}``: continuous batching over a bigram "model".

The model is one ``[vocab, vocab]`` table of logits (the next token depends on the last
one), small enough to read whole, yet the engine does everything the control plane relies
on (``rollart_sdk.interfaces.InferenceEngine``): requests join and leave the running batch
at every step, each with its own seeded generator; ``suspend`` pauses, ``abort`` returns the
tokens so far, ``load_weights`` swaps the table in place and in-flight requests continue
(their "KV cache" is rebuilt: counted in ``recomputed``), every token carries the version
that produced it and its log-prob under the sampled policy (temperature and allowed ids,
``rollart_sdk.algorithms.policy_logprob``: what trainers recompute). Replace the table with
your model; ``tests/test_{name}.py`` runs rollart's conformance kit (``check_engine``).
\"\"\"

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


class {options}(BaseModel):
    model_config = ConfigDict(extra="forbid")

    vocab_size: int = Field(64, ge=2, description="tokens in the bigram table")
    seed: int = Field(0, description="seed of the initial table")
    step_delay_s: float = Field(0.001, ge=0, description="pause per batch step (lets a "
                                "small machine interleave other work)")


def initial_table(vocab_size: int, seed: int) -> torch.Tensor:
    return torch.randn(vocab_size, vocab_size, generator=torch.Generator().manual_seed(seed))


def bigram_logits(table: torch.Tensor, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    \"\"\"Teacher-forced logits ``[len(tokens), vocab]`` that predict each of ``tokens``
    after ``prompt`` (the kit's ``reference_logits``).\"\"\"
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


class {cls}:
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
"""

ENGINE_TEST = """\
import {package}.plugin as plugin
import torch
from {package}.{module} import {cls}, bigram_logits, initial_table

from rollart_sdk.testing.engine import check_engine
from rollart_sdk.weights import split_buckets


def test_conforms():
    table = initial_table(64, 0)
    report = check_engine(
        lambda: {cls}(vocab_size=64, seed=0),
        tokenizer_vocab_size=64,
        reference_logits=lambda prompt, tokens: bigram_logits(table, prompt, tokens),
        update_buckets=lambda version: split_buckets(
            [("table", torch.randn(64, 64))], 1 << 20, version),
    )
    assert not report["skipped"]


def test_registers(register_plugin):
    desc = register_plugin(plugin).registry.get("engine", "{name}")
    assert desc.create({"vocab_size": 8}, model=None).vocab == 8
"""
