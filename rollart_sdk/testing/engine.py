"""``check_engine``: the conformance kit every inference-engine plugin runs in its tests.

Like gymnasium's ``check_env``, it drives a real engine through the contract the control
plane relies on (:class:`rollart_sdk.interfaces.InferenceEngine`) and raises
``AssertionError`` naming the first broken rule::

    from rollart_sdk.testing.engine import check_engine

    def test_conformance(tmp_path):
        report = check_engine(
            lambda: MyEngine(model=prepared),
            tokenizer_vocab_size=vocab,
            reference_logprobs=teacher_forced,   # same model, plain forward pass
            update_buckets=lambda version: [...],  # a different set of weights
        )
        assert not report["skipped"]

Rules checked:

- token out: ids inside the vocabulary; ``token_ids``, ``logprobs`` and ``versions`` of
  equal length; ``max_new_tokens``, ``stop_token_ids`` and ``allowed_token_ids`` obeyed;
- logprobs are the behaviour policy's: equal (within ``tolerance``) to a teacher-forced
  forward pass of the same model, ``log_softmax`` over the full vocabulary for a request
  at temperature 1 (or greedy) without a mask (``logprobs``);
- the sampled policy is the trained policy (``sampled_policy``): at temperature 0.7, with
  and without ``allowed_token_ids``, each logprob is ``log_softmax(mask(logits) / T)`` of
  the teacher-forced logits (:mod:`rollart_sdk.algorithms.policy`), which is what
  trainers recompute for the importance ratio; it needs ``reference_logits``;
- a seeded request samples the same tokens alone and inside a busy batch;
- ABORT: an aborted request returns promptly with ``finish_reason="abort"`` and the
  tokens so far; aborting an unknown id returns False;
- suspend/resume: while suspended no new request starts and in-flight ones do not
  advance; after resume everything completes;
- update: ``load_weights`` bumps ``version``; a request in flight across the update
  continues (not restarted) with ``recomputed >= 1`` and tokens of both versions.

``stats()`` must report at least ``running``, ``waiting``, ``version``,
``tokens_generated`` and ``steps``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import torch

from rollart_sdk.algorithms.policy import policy_logprob
from rollart_sdk.interfaces import InferenceEngine
from rollart_sdk.types import GenerationRequest, GenerationResult, SamplingParams, WeightBucket
from rollart_sdk.weights.buckets import split_buckets, without_aliases

ReferenceLogprobs = Callable[[list[int], list[int]], list[float]]
# Teacher-forced logits [len(token_ids), vocab] at the positions that predict each token.
ReferenceLogits = Callable[[list[int], list[int]], torch.Tensor]
EngineFactory = Callable[[], "InferenceEngine | Awaitable[InferenceEngine]"]
STATS_KEYS = ("running", "waiting", "version", "tokens_generated", "steps")
CHECKS = ("stats", "generate", "logprobs", "sampled_policy", "seeded_determinism",
          "stop_and_allowed", "abort", "suspend_resume", "update")


def check_engine(
    make_engine: EngineFactory,
    tokenizer_vocab_size: int,
    reference_logprobs: ReferenceLogprobs | None = None,
    update_buckets: Callable[[int], Iterable[WeightBucket]] | None = None,
    reference_logits: ReferenceLogits | None = None,
    updated_logits: ReferenceLogits | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Synchronous wrapper around :func:`check_engine_async` (runs its own event loop)."""
    return asyncio.run(
        check_engine_async(
            make_engine,
            tokenizer_vocab_size=tokenizer_vocab_size,
            reference_logprobs=reference_logprobs,
            update_buckets=update_buckets,
            reference_logits=reference_logits,
            updated_logits=updated_logits,
            **kwargs,
        )
    )


async def check_engine_async(
    make_engine: EngineFactory,
    tokenizer_vocab_size: int,
    reference_logprobs: ReferenceLogprobs | None = None,
    update_buckets: Callable[[int], Iterable[WeightBucket]] | None = None,
    prompt_ids: list[int] | None = None,
    tolerance: float = 1e-4,
    long_tokens: int = 400,
    eos_token_ids: Iterable[int] = (),
    timeout_s: float = 60.0,
    seeded_determinism: bool = True,
    reference_logits: ReferenceLogits | None = None,
    only: Iterable[str] | None = None,
    updated_logits: ReferenceLogits | None = None,
) -> dict[str, Any]:
    """Run every check on one engine; return ``{"passed": [...], "skipped": [...]}``.

    ``make_engine`` builds the engine (sync or async); it is shut down at the end.
    ``reference_logits(prompt_ids, token_ids)`` gives the teacher-forced logits
    ``[len(token_ids), vocab]`` of the engine's initial weights at the positions that
    predict each token (the full check: ``logprobs`` and ``sampled_policy``);
    ``reference_logprobs(prompt_ids, token_ids)``, the older form, gives only the
    full-vocabulary logprob of each token and checks ``logprobs`` alone. Without either
    the logprob checks are skipped.
    ``update_buckets(version)`` gives weights to load (ideally different from the initial
    ones); without it the update check is skipped. ``updated_logits``: the teacher-forced
    logits of the weights ``update_buckets`` gives (the model the engine should serve
    after the update); with it the update check also compares the log-probs of new
    requests with them, which catches an update that is accepted but not (or not all)
    loaded: a tensor name the engine skips, a tied embedding.
    ``long_tokens`` is the length of the requests used to observe abort/suspend/update
    mid-flight: the engine must allow prompt + ``long_tokens`` tokens; they exclude ``eos_token_ids`` (via
    ``allowed_token_ids``) so they cannot stop early. ``timeout_s`` bounds each check.
    ``seeded_determinism=False`` skips (and reports as skipped) the same-seed check, for
    an engine that documents that it cannot honour per-request seeds. ``only`` runs just
    the named checks (the rest are reported as skipped), e.g. ``("sampled_policy",)`` on a
    model too large for the whole kit.
    """
    wanted = set(CHECKS if only is None else only)
    if wanted - set(CHECKS):
        raise ValueError(f"check_engine(only=...): unknown checks {sorted(wanted - set(CHECKS))}; "
                         f"the kit has {list(CHECKS)}")
    engine = make_engine()
    if inspect.isawaitable(engine):
        engine = await engine
    assert isinstance(engine, InferenceEngine), (
        f"{type(engine).__name__} does not implement rollart_sdk.interfaces.InferenceEngine "
        "(needs version, generate, abort, suspend, resume, load_weights, stats, shutdown)"
    )
    kit = _Kit(engine, tokenizer_vocab_size, prompt_ids, tolerance, long_tokens, eos_token_ids)
    report: dict[str, Any] = {"passed": [], "skipped": []}
    checks: list[tuple[str, Callable[[], Awaitable[None]], bool]] = [
        ("stats", kit.check_stats, True),
        ("generate", kit.check_generate, True),
        ("logprobs", lambda: kit.check_logprobs(reference_logprobs, reference_logits),
         reference_logprobs is not None or reference_logits is not None),
        ("sampled_policy", lambda: kit.check_sampled_policy(reference_logits),
         reference_logits is not None),
        ("seeded_determinism", kit.check_determinism, seeded_determinism),
        ("stop_and_allowed", kit.check_stop_and_allowed, True),
        ("abort", kit.check_abort, True),
        ("suspend_resume", kit.check_suspend_resume, True),
        ("update", lambda: kit.check_update(update_buckets, updated_logits),
         update_buckets is not None),
    ]
    assert [name for name, _, _ in checks] == list(CHECKS)
    try:
        for name, check, enabled in checks:
            if not enabled or name not in wanted:
                report["skipped"].append(name)
                continue
            try:
                await asyncio.wait_for(check(), timeout_s)
            except TimeoutError:
                raise AssertionError(
                    f"check_engine[{name}]: did not finish within {timeout_s}s "
                    "(a request was left waiting?)"
                ) from None
            report["passed"].append(name)
    finally:
        await engine.shutdown()
    report["stats"] = engine.stats()
    return report


class _Kit:
    def __init__(
        self,
        engine: InferenceEngine,
        vocab: int,
        prompt_ids: list[int] | None,
        tolerance: float,
        long_tokens: int,
        eos_token_ids: Iterable[int],
    ) -> None:
        self.engine = engine
        self.vocab = vocab
        self.prompt = list(prompt_ids) if prompt_ids else [(7 * i + 3) % vocab for i in range(12)]
        self.tol = tolerance
        self.long = long_tokens
        eos = set(eos_token_ids)
        self.no_eos = [i for i in range(vocab) if i not in eos]
        self._n = 0

    def long_req(self, seed: int) -> GenerationRequest:
        """A request that runs ``long_tokens`` tokens (no stop token can be sampled)."""
        return self.req(temperature=1.0, seed=seed, max_new_tokens=self.long,
                        allowed_token_ids=self.no_eos)

    def req(self, **sampling: Any) -> GenerationRequest:
        self._n += 1
        prompt = sampling.pop("prompt", self.prompt)
        return GenerationRequest(f"check-{self._n}", list(prompt), SamplingParams(**sampling))

    def well_formed(self, res: GenerationResult, req: GenerationRequest, what: str) -> None:
        n = len(res.token_ids)
        assert res.request_id == req.request_id, f"{what}: result for {res.request_id!r}"
        assert len(res.logprobs) == n and len(res.versions) == n, (
            f"{what}: token_ids ({n}), logprobs ({len(res.logprobs)}) and versions "
            f"({len(res.versions)}) must have equal length"
        )
        assert n <= req.sampling.max_new_tokens, (
            f"{what}: {n} tokens > max_new_tokens={req.sampling.max_new_tokens}"
        )
        bad = [t for t in res.token_ids if not 0 <= t < self.vocab]
        assert not bad, f"{what}: token ids {bad[:5]} outside [0, {self.vocab})"
        assert all(lp <= 1e-6 for lp in res.logprobs), f"{what}: a logprob is positive"
        assert res.finish_reason in ("stop", "length", "abort"), (
            f"{what}: finish_reason {res.finish_reason!r}"
        )

    async def wait_tokens(
        self, at_least: int, task: asyncio.Future[Any], deadline_s: float = 30.0
    ) -> None:
        """Wait until the engine reports ``at_least`` generated tokens in total while
        ``task`` (the long request) is still running; its error, if any, is raised."""
        end = time.monotonic() + deadline_s
        while self.engine.stats()["tokens_generated"] < at_least:
            if task.done():
                res = task.result()  # raises the request's error, if it failed
                raise AssertionError(
                    f"the long request ended early ({res.finish_reason}, "
                    f"{len(res.token_ids)} tokens) before tokens_generated reached {at_least}"
                )
            assert time.monotonic() < end, (
                f"engine produced no tokens within {deadline_s}s (stats: {self.engine.stats()})"
            )
            await asyncio.sleep(0.001)

    # ------------------------------------------------------------------ checks

    async def check_stats(self) -> None:
        stats = self.engine.stats()
        missing = [k for k in STATS_KEYS if k not in stats]
        assert not missing, f"stats() lacks keys {missing}; it returned {sorted(stats)}"
        assert isinstance(self.engine.version, int), "version must be an int"

    async def check_generate(self) -> None:
        req = self.req(temperature=0.0, max_new_tokens=8)
        res = await self.engine.generate(req)
        self.well_formed(res, req, "greedy generate")
        assert res.token_ids, "greedy generate returned no tokens"
        assert set(res.versions) == {self.engine.version}, (
            f"versions {set(res.versions)} != engine version {self.engine.version}"
        )
        again = await self.engine.generate(self.req(temperature=0.0, max_new_tokens=8))
        assert again.token_ids == res.token_ids, "greedy decoding is not deterministic"
        # Many concurrent requests of different lengths all complete.
        reqs = [self.req(temperature=1.0, seed=i, max_new_tokens=3 + 2 * i,
                         prompt=self.prompt[: 2 + i % len(self.prompt)]) for i in range(12)]
        results = await asyncio.gather(*(self.engine.generate(r) for r in reqs))
        for r, q in zip(results, reqs, strict=True):
            self.well_formed(r, q, f"concurrent {q.request_id}")
            assert r.finish_reason != "abort", f"{q.request_id} was aborted unasked"

    async def check_logprobs(self, reference: ReferenceLogprobs | None,
                             logits: ReferenceLogits | None) -> None:
        """Unconstrained requests at temperature 1 or greedy: the policy is the raw
        distribution, so the logprob is the full-vocabulary one."""
        for sampling in ({"temperature": 0.0}, {"temperature": 1.0, "seed": 3},
                         {"temperature": 1.0, "seed": 5, "max_new_tokens": 1}):
            sampling = {"max_new_tokens": 12, **sampling}
            await self._compare(sampling, reference, logits)

    async def check_sampled_policy(self, logits: ReferenceLogits | None) -> None:
        """Temperature 0.7 with and without ``allowed_token_ids``, and temperature 1 with
        them: the logprob is that of ``softmax(mask(logits) / T)``, the distribution the
        token was drawn from. Constrained actions use a few ids (little of the model's
        mass), one token as the pipeline asks for an action and several in a row."""
        allowed = sorted({3 % self.vocab, 5 % self.vocab, 11 % self.vocab, 17 % self.vocab})
        for sampling in ({"temperature": 0.7, "seed": 4},
                         {"temperature": 0.7, "seed": 6, "allowed_token_ids": allowed,
                          "max_new_tokens": 1},
                         {"temperature": 0.7, "seed": 7, "allowed_token_ids": allowed},
                         {"temperature": 1.0, "seed": 8, "allowed_token_ids": allowed}):
            sampling = {"max_new_tokens": 12, **sampling}
            await self._compare(sampling, None, logits)

    async def _compare(self, sampling: dict[str, Any], reference: ReferenceLogprobs | None,
                       logits: ReferenceLogits | None, after_update: bool = False) -> None:
        req = self.req(**sampling)
        res = await self.engine.generate(req)
        prompt, tokens = list(req.prompt_ids), list(res.token_ids)
        if logits is not None:
            rows = logits(prompt, tokens)
            assert tuple(rows.shape[:1]) == (len(tokens),), (
                f"reference_logits returned shape {tuple(rows.shape)} for {len(tokens)} tokens")
            mask = (torch.tensor(sampling["allowed_token_ids"], dtype=torch.long)
                    if sampling.get("allowed_token_ids") else None)
            ref = [policy_logprob(rows[i], t, sampling["temperature"], mask)
                   for i, t in enumerate(tokens)]
        else:
            assert reference is not None
            ref = reference(prompt, tokens)
        assert len(ref) == len(tokens), "the reference returned a wrong length"
        worst = max((abs(a - b) for a, b in zip(res.logprobs, ref, strict=True)), default=0.0)
        assert worst <= self.tol, (
            "after load_weights, the served weights are not the loaded ones (a tensor the "
            f"engine skipped or loaded wrong, a tied embedding?): logprobs with {sampling} "
            f"differ from a teacher-forced pass of the loaded weights by {worst:.2e} "
            f"(> {self.tol})" if after_update else
            f"logprobs with {sampling} differ from a teacher-forced forward pass by "
            f"{worst:.2e} (> {self.tol}); report the log-prob of the sampled policy, "
            "log_softmax(mask(logits) / temperature)[token] of the serving weights (greedy: "
            "temperature 1; top-k/top-p not applied), rollart_sdk.algorithms.policy_logprob"
        )

    async def check_determinism(self) -> None:
        sampling = {"temperature": 1.0, "seed": 1234, "max_new_tokens": 16}
        alone = await self.engine.generate(self.req(**sampling))
        others = [self.engine.generate(self.req(temperature=1.0, seed=i, max_new_tokens=20,
                                                prompt=self.prompt[i:]))
                  for i in range(1, 6)]
        busy, *_ = await asyncio.gather(self.engine.generate(self.req(**sampling)), *others)
        assert busy.token_ids == alone.token_ids, (
            "the same seed and prompt sampled different tokens alone and in a batch "
            f"({alone.token_ids} vs {busy.token_ids}); use a per-request generator"
        )

    async def check_stop_and_allowed(self) -> None:
        greedy = await self.engine.generate(self.req(temperature=0.0, max_new_tokens=4))
        stop = greedy.token_ids[0]
        res = await self.engine.generate(
            self.req(temperature=0.0, max_new_tokens=4, stop_token_ids=[stop])
        )
        assert res.token_ids == [stop] and res.finish_reason == "stop", (
            f"stop_token_ids=[{stop}] should end after that token with 'stop'; got "
            f"{res.token_ids} ({res.finish_reason})"
        )
        allowed = sorted({3 % self.vocab, 5 % self.vocab, 11 % self.vocab})
        for temp in (0.0, 1.0):
            req = self.req(temperature=temp, seed=9, max_new_tokens=10, allowed_token_ids=allowed)
            res = await self.engine.generate(req)
            self.well_formed(res, req, "allowed_token_ids")
            bad = [t for t in res.token_ids if t not in allowed]
            assert not bad, f"allowed_token_ids={allowed} but sampled {bad}"

    async def check_abort(self) -> None:
        assert await self.engine.abort("check-no-such-request") is False, (
            "abort of an unknown request id must return False"
        )
        before = self.engine.stats()["tokens_generated"]
        req = self.long_req(5)
        task = asyncio.ensure_future(self.engine.generate(req))
        await self.wait_tokens(before + 2, task)
        assert await self.engine.abort(req.request_id) is True, "abort of a running request"
        t0 = time.monotonic()
        res = await asyncio.wait_for(task, 10.0)
        took = time.monotonic() - t0
        self.well_formed(res, req, "aborted request")
        assert res.finish_reason == "abort", f"aborted request finished with {res.finish_reason!r}"
        assert 0 < len(res.token_ids) < self.long, (
            f"an aborted request should return the {len(res.token_ids)} tokens made so far"
        )
        assert took < 10.0, f"abort took {took:.1f}s to return"
        # Abort of a request still waiting (engine suspended) returns too.
        await self.engine.suspend()
        queued = self.req(max_new_tokens=4)
        task = asyncio.ensure_future(self.engine.generate(queued))
        await asyncio.sleep(0.05)
        assert await self.engine.abort(queued.request_id) is True, (
            "abort of a request queued while suspended returned False (did it run anyway? "
            "suspend must stop admitting new requests)"
        )
        res = await asyncio.wait_for(task, 10.0)
        assert res.finish_reason == "abort" and res.token_ids == [], (
            f"a queued request aborted before it started: {res.token_ids} ({res.finish_reason})"
        )
        await self.engine.resume()

    async def check_suspend_resume(self) -> None:
        before = self.engine.stats()["tokens_generated"]
        inflight = self.long_req(6)
        t_in = asyncio.ensure_future(self.engine.generate(inflight))
        await self.wait_tokens(before + 2, t_in)
        await self.engine.suspend()
        frozen = self.engine.stats()["tokens_generated"]
        queued = self.req(temperature=0.0, max_new_tokens=3)
        t_q = asyncio.ensure_future(self.engine.generate(queued))
        await asyncio.sleep(0.3)
        assert not t_q.done(), "a request finished while the engine was suspended"
        assert not t_in.done(), "an in-flight request finished while the engine was suspended"
        assert self.engine.stats()["tokens_generated"] == frozen, (
            "the engine kept generating while suspended (in-flight requests must pause)"
        )
        assert self.engine.stats()["waiting"] >= 1, "a request sent while suspended must wait"
        await self.engine.resume()
        res_q, res_in = await asyncio.gather(t_q, t_in)
        self.well_formed(res_q, queued, "request queued while suspended")
        self.well_formed(res_in, inflight, "request paused by suspend")
        assert res_in.finish_reason != "abort" and res_q.finish_reason != "abort", (
            "suspend must keep requests, not abort them"
        )

    async def check_update(self, update_buckets: Callable[[int], Iterable[WeightBucket]] | None,
                           updated_logits: ReferenceLogits | None = None) -> None:
        assert update_buckets is not None
        old = self.engine.version
        before = self.engine.stats()["tokens_generated"]
        req = self.long_req(8)
        task = asyncio.ensure_future(self.engine.generate(req))
        await self.wait_tokens(before + 2, task)
        await self.engine.suspend()
        assert not task.done(), (
            f"the {self.long}-token request ended before the update; raise long_tokens"
        )
        recomputed = await self.engine.load_weights(update_buckets(old + 1), old + 1)
        assert self.engine.version == old + 1, (
            f"version after load_weights(..., {old + 1}) is {self.engine.version}"
        )
        assert recomputed >= 1, f"load_weights reported {recomputed} in-flight requests recomputed"
        await self.engine.resume()
        res = await task
        self.well_formed(res, req, "request in flight across an update")
        assert res.finish_reason != "abort", "an update must not abort in-flight requests"
        assert res.recomputed >= 1, "GenerationResult.recomputed must count the KV rebuild"
        assert res.versions == sorted(res.versions), "token versions must not go backwards"
        assert res.versions[0] == old and res.versions[-1] == old + 1, (
            f"expected tokens of versions {old} then {old + 1}; got {sorted(set(res.versions))}"
        )
        assert len(res.token_ids) == self.long or res.finish_reason == "stop", (
            "the request restarted or lost tokens across the update"
        )
        after = await self.engine.generate(self.req(temperature=0.0, max_new_tokens=3))
        assert set(after.versions) == {old + 1}, "new requests must use the new version"
        if updated_logits is not None:  # the new version's values, not only its number
            for sampling in ({"temperature": 0.0}, {"temperature": 1.0, "seed": 11},
                             {"temperature": 0.7, "seed": 12}):
                await self._compare({"max_new_tokens": 12, **sampling}, None, updated_logits,
                                    after_update=True)


def perturbed_weights(model: Any, seed: int = 0, scale: float = 0.1) -> dict[str, torch.Tensor]:
    """A "next version" of ``model`` for the update check on a real checkpoint: every
    parameter plus Gaussian noise of ``scale`` times its own spread, applied in place (so
    ``model`` is then the reference of the new version: :func:`teacher_forced_logits`),
    returned as a copy of its ``state_dict`` as a trainer exports it: a tied embedding
    once, as ``model.embed_tokens.weight`` (:func:`rollart_sdk.weights.without_aliases`),
    so the engine must tie ``lm_head`` to it again."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            spread = p.float().std().clamp(min=1e-3) if p.numel() > 1 else torch.tensor(1e-3)
            p.add_((torch.randn(p.shape, generator=gen) * scale * spread).to(p.dtype))
    return {k: v.detach().clone() for k, v in without_aliases(model.state_dict().items())}


def pretrained_checks(model_path: str, bucket_bytes: int = 64 << 20,
                      prompt: str = "Compute 3+8. Answer with the number.") -> dict[str, Any]:
    """:func:`check_engine` keyword arguments for a real checkpoint folder (a run's
    prepared model: SmolLM2 from its GGUF, say): its tokenizer's size and end token, the
    chat-templated ``prompt``, transformers' teacher-forced logits as the reference, and
    a next version (:func:`perturbed_weights`, the tied embedding once as the trainers
    send it) as ``update_buckets`` with its own logits as ``updated_logits``."""
    from rollart_sdk.models import load_causal_lm, load_tokenizer

    tok = load_tokenizer(model_path)
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                   add_generation_prompt=True)
    updated = load_causal_lm(model_path, implementation="transformers")
    state = perturbed_weights(updated)
    return {
        "tokenizer_vocab_size": len(tok),
        "prompt_ids": tok.encode(text, add_special_tokens=False),
        "eos_token_ids": [tok.eos_token_id],
        "reference_logits": teacher_forced_logits(
            load_causal_lm(model_path, implementation="transformers")),
        "update_buckets": lambda v: split_buckets(state.items(), bucket_bytes, v),
        "updated_logits": teacher_forced_logits(updated),
    }


def teacher_forced_logits(model: Any) -> ReferenceLogits:
    """A ``reference_logits`` for :func:`check_engine` from a causal LM with the
    transformers call convention (``model(ids).logits``): one plain forward of prompt +
    tokens, the fp32 logits at the positions that predict each token."""

    def logits(prompt: list[int], tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            out = model(torch.tensor([prompt + tokens])).logits[0].float()
        return out[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]

    return logits

