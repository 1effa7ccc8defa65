"""Behaviour of engine 'torch' beyond the conformance kit: batching bounds, KV recompute
correctness, all-or-nothing weight loads, input errors, registration."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import rollart_engine_torch.plugin as plugin_module
import torch
from rollart_engine_torch.engine import TorchEngine

from rollart_sdk.errors import ConfigError
from rollart_sdk.models import load_causal_lm, load_tokenizer
from rollart_sdk.plugins import load_plugins
from rollart_sdk.types import GenerationRequest, SamplingParams, WeightBucket
from rollart_sdk.weights import split_buckets


def _req(rid: str, prompt: list[int], **sampling) -> GenerationRequest:
    return GenerationRequest(rid, prompt, SamplingParams(**sampling))


def _max_err(logprobs: list[float], ref: list[float]) -> float:
    assert len(logprobs) == len(ref)
    return max(abs(a - b) for a, b in zip(logprobs, ref, strict=True))


def test_mixed_batch_logprobs_and_slot_bound(tiny_model, reference):
    """More requests than slots, of different lengths: slots are reused and compacted as
    requests finish, every token's logprob still matches a teacher-forced pass."""

    async def run():
        engine = TorchEngine(model=tiny_model, max_running=3, eos_token_ids=[])
        reqs = [
            _req(f"r{i}", [(5 * i + j) % 90 + 7 for j in range(2 + 3 * i)],
                 temperature=1.0, seed=i, max_new_tokens=4 + (7 * i) % 13)
            for i in range(9)
        ]
        tasks = [asyncio.ensure_future(engine.generate(r)) for r in reqs]
        peak_running, peak_waiting = 0, 0
        while not all(t.done() for t in tasks):
            s = engine.stats()
            peak_running = max(peak_running, s["running"])
            peak_waiting = max(peak_waiting, s["waiting"])
            await asyncio.sleep(0)
        results = [t.result() for t in tasks]
        await engine.shutdown()
        return reqs, results, peak_running, peak_waiting, engine.stats()

    reqs, results, peak_running, peak_waiting, stats = asyncio.run(run())
    assert peak_running <= 3 and peak_waiting >= 1
    for q, r in zip(reqs, results, strict=True):
        assert r.finish_reason == "length" and len(r.token_ids) == q.sampling.max_new_tokens
        assert _max_err(r.logprobs, reference(q.prompt_ids, r.token_ids)) < 1e-4
    assert stats["tokens_generated"] == sum(q.sampling.max_new_tokens for q in reqs)
    assert stats["kv_cache_bytes"] <= stats["kv_cache_bytes_max"]


def test_recomputed_kv_matches_new_weights(tiny_model, other_weights):
    """Tokens after an update are scored by the NEW weights over the whole context, i.e.
    the KV cache was rebuilt, not reused from the old weights."""
    new_model = load_causal_lm(tiny_model.path)
    new_model.load_state_dict(other_weights)

    async def run():
        engine = TorchEngine(model=tiny_model, max_running=4, eos_token_ids=[])
        req = _req("long", [10, 20, 30, 40], temperature=1.0, seed=3, max_new_tokens=300)
        task = asyncio.ensure_future(engine.generate(req))
        while engine.stats()["tokens_generated"] < 5:
            await asyncio.sleep(0.001)
        await engine.suspend()
        n = await engine.load_weights([WeightBucket(1, 0, dict(other_weights))], version=1)
        await engine.resume()
        res = await task
        await engine.shutdown()
        return req, res, n

    req, res, n = asyncio.run(run())
    assert n == 1 and res.recomputed == 1 and len(res.token_ids) == 300
    first_new = res.versions.index(1)
    assert 5 <= first_new < 300
    with torch.no_grad():
        logits = new_model(torch.tensor([req.prompt_ids + res.token_ids])).logits[0]
    lp = torch.log_softmax(logits.float(), dim=-1)
    ref = [float(lp[len(req.prompt_ids) - 1 + i, t]) for i, t in enumerate(res.token_ids)]
    assert _max_err(res.logprobs[first_new:], ref[first_new:]) < 1e-4
    # ... and the old tokens really were produced by different weights.
    assert _max_err(res.logprobs[:first_new], ref[:first_new]) > 1e-3


def test_bad_weights_leave_old_version_serving(tiny_model, other_weights):
    async def run():
        engine = TorchEngine(model=tiny_model)
        prompt = [11, 12, 13]
        before = await engine.generate(_req("a", prompt, temperature=0.0, max_new_tokens=6))
        good = list(split_buckets(other_weights.items(), 20_000, version=1))
        bad = WeightBucket(1, len(good), {"model.no_such.weight": torch.zeros(2)})
        with pytest.raises(ValueError, match="no_such"):
            await engine.load_weights([*good, bad], version=1)
        shape = WeightBucket(1, 0, {"lm_head.weight": torch.zeros(3, 3)})
        with pytest.raises(ValueError, match="shape"):
            await engine.load_weights([shape], version=1)
        after = await engine.generate(_req("b", prompt, temperature=0.0, max_new_tokens=6))
        version = engine.version
        await engine.shutdown()
        return before, after, version

    before, after, version = asyncio.run(run())
    assert version == 0
    assert after.token_ids == before.token_ids and after.logprobs == before.logprobs


def test_request_errors_say_what_to_fix(tiny_model):
    async def run():
        engine = TorchEngine(model=tiny_model, max_seq_len=32)
        with pytest.raises(ValueError, match="prompt_ids is empty"):
            await engine.generate(_req("e", []))
        with pytest.raises(ValueError, match="max_seq_len=32"):
            await engine.generate(_req("l", [5] * 40))
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await engine.generate(_req("v", [5, 10_000_000]))
        with pytest.raises(ValueError, match="allowed_token_ids"):
            await engine.generate(_req("a", [5], allowed_token_ids=[]))
        # Context full ends the request with "length", not an error.
        res = await engine.generate(_req("c", [5] * 28, temperature=0.0, max_new_tokens=50))
        await engine.shutdown()
        return res

    res = asyncio.run(run())
    assert res.finish_reason == "length" and len(res.token_ids) == 32 - 28


def test_cancelled_caller_frees_its_slot(tiny_model):
    async def run():
        engine = TorchEngine(model=tiny_model, max_running=1, eos_token_ids=[])
        task = asyncio.ensure_future(engine.generate(_req("x", [3, 4], max_new_tokens=1000)))
        while engine.stats()["tokens_generated"] < 2:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # With the only slot freed, a new request gets served.
        res = await asyncio.wait_for(engine.generate(_req("y", [3], max_new_tokens=3)), 30)
        await engine.shutdown()
        return res

    assert len(asyncio.run(run()).token_ids) == 3


def test_registered_through_plugin_hook(tiny_model):
    ps = load_plugins(autoload=False, extra={"rollart-engine-torch": plugin_module}, strict=True)
    desc = ps.registry.get("engine", "torch")
    with pytest.raises(ConfigError, match="max_runing"):
        desc.validate_options({"max_runing": 2})
    engine = desc.create({"max_running": 2}, model=tiny_model)
    assert engine.stats()["max_running"] == 2
    tok = load_tokenizer(tiny_model.path)
    assert len(tok.encode("Left")) == 1  # action words are single tokens of the tiny vocab


def test_plugin_module_imports_no_torch():
    code = "import sys, rollart_engine_torch.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _four_seeded(tiny_model, **engine_kw) -> tuple[list, dict]:
    """Four seeded requests of 40 prompt tokens and 6 new ones through a fresh engine:
    each one's (token ids, logprobs), and the engine's stats."""

    async def main() -> tuple[list, dict]:
        engine = TorchEngine(model=tiny_model, max_running=4, eos_token_ids=[], **engine_kw)
        reqs = [_req(f"r{i}", [(3 * i + j) % 90 + 7 for j in range(40)], temperature=1.0,
                     seed=i, max_new_tokens=6) for i in range(4)]
        results = await asyncio.gather(*(engine.generate(r) for r in reqs))
        stats = engine.stats()
        await engine.shutdown()
        return [(r.token_ids, r.logprobs) for r in results], stats

    return asyncio.run(main())


def test_small_steps_run_on_the_loop_with_the_same_tokens(tiny_model, reference):
    """inline_step_s: once the engine has measured its cost per token, a step predicted
    to be that short runs on the event loop (no thread hop); the tokens and logprobs of
    seeded requests are the same as with every step in a thread."""

    threaded, s_thread = _four_seeded(tiny_model, inline_step_s=0.0)
    inline, s_inline = _four_seeded(tiny_model, inline_step_s=1.0)
    assert s_thread["inline_steps"] == 0
    # The first step (4 x 40 prompt tokens) measures the cost in a thread; the decode
    # steps after it are predicted short and run inline.
    assert s_inline["inline_steps"] == s_inline["steps"] - 1 > 0
    assert inline == threaded
    prompt = [(3 * 0 + j) % 90 + 7 for j in range(40)]
    assert _max_err(inline[0][1], reference(prompt, inline[0][0])) < 1e-4


def test_long_steps_run_on_the_burst_threads_short_ones_on_the_plans(tiny_model, reference,
                                                                      monkeypatch):
    """``burst_threads`` (a sync run on Ray): a step whose predecessor on the compute
    thread took at least ``burst_step_s`` runs on that many torch threads, the others on
    the count the engine was built with; the tokens are those of a run without it. An
    explicit ``num_threads`` turns it off."""
    import rollart_engine_torch.engine as engine_mod

    counts: list[int] = []
    real = engine_mod._timed_step

    def spy(*args):
        out = real(*args)
        counts.append(torch.get_num_threads())
        return out

    monkeypatch.setattr(engine_mod, "_timed_step", spy)

    def run(**kw) -> tuple[list, dict]:
        return _four_seeded(tiny_model, inline_step_s=0.0, **kw)

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plain, s_plain = run()
        assert set(counts) == {1} and s_plain["burst_steps"] == 0
        counts.clear()
        burst, s_burst = run(burst_threads=2, burst_step_s=0.0)
        # the first step has no predecessor: the engine's own count; every later one: 2
        assert counts[0] == 1 and set(counts[1:]) == {2} and len(counts) == s_burst["steps"]
        assert s_burst["burst_steps"] == s_burst["steps"] - 1 > 0
        counts.clear()
        _, s_short = run(burst_threads=2, burst_step_s=60.0)  # none that long
        assert set(counts) == {1} and s_short["burst_steps"] == 0
        counts.clear()
        _, s_own = run(burst_threads=2, burst_step_s=0.0, num_threads=1)
        assert set(counts) == {1} and s_own["burst_steps"] == 0
    finally:
        torch.set_num_threads(before)
    assert [t for t, _ in burst] == [t for t, _ in plain]  # the same tokens
    assert max(_max_err(b, p) for (_, b), (_, p) in zip(burst, plain, strict=True)) < 1e-4
