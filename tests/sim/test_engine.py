"""The sim engine's costs: the roofline by hand, one request's virtual time equal to its
modelled steps, KV capacity serialising requests, aborts, weight swaps."""

from __future__ import annotations

import asyncio

import pytest

from rollart_sdk.sim.clock import run_virtual
from rollart_sdk.sim.costs import (
    HARDWARE,
    MODELS,
    Dist,
    HardwareClass,
    engine_step_s,
    kv_capacity_tokens,
    prefill_pairs,
    train_step_s,
)
from rollart_sdk.sim.engine import SimEngine
from rollart_sdk.types import GenerationRequest, SamplingParams

Q8 = MODELS["qwen3-8b"]
H800 = HARDWARE["H800"]


def request(rid: str, prompt: int, tag: str = "t", max_new: int = 100_000, tid: str = "") -> GenerationRequest:
    return GenerationRequest(rid, [1] * prompt, SamplingParams(max_new_tokens=max_new, seed=1),
                             tag=tag, trajectory_id=tid or rid)


def engine(n_out: int, hw: HardwareClass = H800, **kw) -> SimEngine:
    return SimEngine(hardware=hw, model_spec=Q8, response_tokens={"t": Dist(mean=n_out)}, **kw)


def test_roofline_by_hand():
    # Decode of one token, empty context: the weights are read once (bandwidth-bound).
    w = 8.2e9 * 2
    assert engine_step_s(H800, 1, Q8, 0, 0, 1, 0) == pytest.approx(w / (3.35e12 * 0.75) + 0.003)
    # A 4096-token prefill is FLOP-bound: 2 N per token + attention pairs.
    flop = 2 * 8.2e9 * 4096 + 4 * 36 * 4096 * prefill_pairs(4096, 0)
    assert engine_step_s(H800, 1, Q8, 4096, prefill_pairs(4096, 0), 0, 0) == pytest.approx(
        flop / (989e12 * 0.5) + 0.003)
    # H20: 6.7x less compute, a bit more bandwidth: prefill slower, decode faster.
    h20 = HARDWARE["H20"]
    assert engine_step_s(h20, 1, Q8, 4096, 0, 0, 0) > 5 * engine_step_s(H800, 1, Q8, 4096, 0, 0, 0)
    assert engine_step_s(h20, 1, Q8, 0, 0, 8, 8000) < engine_step_s(H800, 1, Q8, 0, 0, 8, 8000)
    # Batch-size dependent: a decode step of 512 costs more than one of 1 (compute and KV).
    assert engine_step_s(H800, 1, Q8, 0, 0, 512, 512 * 2000) > 2 * engine_step_s(H800, 1, Q8, 0, 0, 1, 2000)


def test_train_step_by_hand():
    # qwen3-8b (8.2e9 parameters, 36 layers, attention width 4096) on 8 H800 at mfu 0.5:
    # 8 x (N per token + 2 x layers x hidden per causal pair), over two sequences
    tokens, pairs = 30 + 100, 30 * 31 / 2 + 100 * 101 / 2
    flop = 8 * (8.2e9 * tokens + 2 * 36 * 4096 * pairs)
    assert train_step_s(H800, 8, Q8, [30, 100]) == pytest.approx(flop / (989e12 * 0.5 * 8))
    # the overhead adds as is; a factor of 6 (no old-log-prob pass) costs 3/4 as much
    assert train_step_s(H800, 8, Q8, [30, 100], overhead_s=0.25) == pytest.approx(
        flop / (989e12 * 0.5 * 8) + 0.25)
    assert train_step_s(H800, 8, Q8, [30, 100], flops_per_token_factor=6.0) == pytest.approx(
        0.75 * flop / (989e12 * 0.5 * 8))


def test_one_request_takes_exactly_its_modelled_steps():
    P, N = 1000, 300
    eng = engine(N)

    async def main():
        return await eng.generate(request("r", P))

    result, elapsed = run_virtual(main())
    prefill = engine_step_s(H800, 1, Q8, P, prefill_pairs(P, 0), 0, 0.0)
    per = engine_step_s(H800, 1, Q8, 0, 0.0, 1, P + 1 + (N - 1) / 2)
    assert elapsed == pytest.approx(prefill + (N - 1) * per, rel=1e-9)
    assert len(result.token_ids) == N and result.finish_reason == "stop"


def test_batched_decode_shares_steps_so_two_requests_take_less_than_twice_one():
    async def one(eng):
        return await eng.generate(request("a", 100))

    async def two(eng):
        return await asyncio.gather(eng.generate(request("b", 100)), eng.generate(request("c", 100)))

    _, t1 = run_virtual(one(engine(500)))
    _, t2 = run_virtual(two(engine(500)))
    assert t1 < t2 < 1.2 * t1  # decode is bandwidth-bound: a second request is nearly free


def test_kv_capacity_makes_requests_wait():
    # Room for the weights and ~1.5 requests' KV: the second waits for the first.
    need = 2000 + 3000
    mem_gb = (Q8.weight_bytes + 1.5 * need * Q8.kv_bytes_per_token) / 1e9 / 0.9
    small = H800.model_copy(update={"memory_gb": mem_gb})
    big = H800.model_copy(update={"memory_gb": 80})

    async def pair(e):
        return await asyncio.gather(e.generate(request("a", 2000)), e.generate(request("b", 2000)))

    _, t_small = run_virtual(pair(engine(3000, small)))
    _, t_big = run_virtual(pair(engine(3000, big)))
    assert t_small > 1.8 * t_big


def test_max_new_tokens_caps_the_response_and_says_length():
    eng = engine(1000)

    async def main():
        return await eng.generate(request("r", 10, max_new=64))

    result, _ = run_virtual(main())
    assert len(result.token_ids) == 64 and result.finish_reason == "length"


def test_abort_returns_the_tokens_so_far_and_frees_the_slot():
    eng = engine(100_000)

    async def main():
        task = asyncio.ensure_future(eng.generate(request("r", 10)))
        await asyncio.sleep(5.0)
        assert await eng.abort("r")
        res = await task
        return res, eng.stats()

    (res, stats), elapsed = run_virtual(main())
    assert res.finish_reason == "abort" and 0 < len(res.token_ids) < 100_000
    assert stats["running"] == 0 and elapsed == pytest.approx(5.0, abs=0.1)


def test_abort_during_the_prefill_step_answers_at_once_and_frees_the_kv():
    # Admitted and in the prefill step (neither waiting nor running): the abort used to
    # find nothing, and the request generated its whole response (a run's stop then
    # waited for it). Now it is answered at the abort and its KV freed after the step.
    eng = engine(100_000)

    async def main():
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(eng.generate(request("r", 30_000)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        before = eng.stats()  # the long prompt's prefill step is under way
        assert before["waiting"] == 0 and before["running"] == 0
        t0 = loop.time()
        assert await eng.abort("r")
        res = await task
        answered = loop.time() - t0
        await asyncio.sleep(10)  # past the prefill step
        return res, answered, eng.stats(), eng._kv_used

    (res, answered, stats, kv_used), _ = run_virtual(main())
    assert res.finish_reason == "abort" and res.token_ids == [] and answered == 0.0
    assert stats["running"] == 0 and kv_used == 0


def test_weight_swap_recomputes_in_flight_and_stamps_versions():
    eng = engine(2000)

    async def main():
        task = asyncio.ensure_future(eng.generate(request("r", 500)))
        await asyncio.sleep(3.0)
        await eng.suspend()
        n = await eng.load_weights([], 1)
        await eng.resume()
        return n, await task

    (n, res), _ = run_virtual(main())
    assert n == 1 and res.recomputed == 1
    assert res.versions[0] == 0 and res.versions[-1] == 1
    assert eng.recompute_s > 0


def test_prefix_cache_prefills_only_the_new_tokens_of_a_next_turn():
    eng = engine(100)

    async def main():
        await eng.generate(request("t0", 1000, tid="traj"))
        before = eng.prefill_tokens
        await eng.generate(request("t1", 1100 + 50, tid="traj"))  # 1000 + 100 out + 50 new
        return eng.prefill_tokens - before

    new, _ = run_virtual(main())
    assert new == 50


def test_kv_cache_is_sized_from_the_devices_on_its_hardware():
    """``devices_by_hardware`` sets an engine's devices on its hardware class: its KV cache
    (and its step costs) count those devices, not the ``devices`` default."""
    two = engine(10, devices=1, devices_by_hardware={"H800": 2}, hardware_name="H800")
    one = engine(10, devices=1, devices_by_hardware={"H20": 2}, hardware_name="H800")
    assert two.devices == 2 and one.devices == 1
    assert two.capacity == kv_capacity_tokens(H800, 2, Q8)
    assert one.capacity == kv_capacity_tokens(H800, 1, Q8) < two.capacity
    # qwen3-8b (16.4 GB of weights) does not fit one 16 GB device, but two on this class
    small = H800.model_copy(update={"memory_gb": 16.0})
    with pytest.raises(ValueError, match="does not fit on 1 device"):
        engine(10, hw=small, devices=1)
    eng = engine(10, hw=small, devices=1, devices_by_hardware={"S16": 2}, hardware_name="S16")
    assert eng.capacity == kv_capacity_tokens(small, 2, Q8) > 0


def test_pd_turns_prefill_only_new_tokens_and_send_only_missing_kv():
    """PD on the sim engine, as on the torch one: the prefill engine keeps a trajectory's
    prefix and takes the decode engine's answer back (export_kv), so each turn prefills the
    observation only; the hand-off carries only what the decode engine lacks (its last
    result's kv_kept), the decode engine prefills nothing; a decode engine that lost its
    cache prefills itself."""
    pre, dec = engine(50), engine(50)

    async def turns(n: int, drop_decode_cache_at: int = -1):
        out, prompt, held = [], 1000, (0, None, 0)  # (kv_kept, its version, prefill has)
        for t in range(n):
            if t == drop_decode_cache_at:
                await dec.release("tr")
            req = request(f"r{t}", prompt, tid="tr")
            p0, d0 = pre.prefill_tokens, dec.prefill_tokens
            answer = await dec.export_kv("tr", held[2]) if t else None  # as the proxy asks
            kv = await pre.prefill_kv(req, held[0], held[1], answer)
            res = await dec.generate(req, kv=kv)
            out.append((prompt, kv, res, pre.prefill_tokens - p0, dec.prefill_tokens - d0,
                        answer))
            held = (res.kv_kept, res.versions[-1], prompt - 1)
            prompt += 50 + 200  # the answer + the next observation
        return out

    (first, second, third), _ = run_virtual(turns(3, drop_decode_cache_at=2))
    assert first[1].start == 0 and first[1].carried == 1000 and first[3] == 1000
    assert first[2].kv_kept == 1000 + 50 and first[4] == 0
    assert second[5].start == 999 and second[5].carried == 51  # the answer (+ its prompt's last)
    # Turn 2: the prefill engine computed the observation only, the observation's K/V
    # travelled, the decode engine prefilled nothing.
    assert second[3] == 200 and second[1].start == 1050 and second[1].carried == 200
    assert second[4] == 0 and dec.handoff_short == 1  # (turn 3 below)
    assert pre.handoff_tokens_out == 1000 + 200 + 200
    # Turn 3: the decode engine's cache was freed: it has no answer to hand back (the
    # prefill engine computes it: 50 + 200) and prefills the whole prompt itself.
    assert third[5] is None and third[3] == 250 and third[4] == third[0]
    assert dec.kv_transfer_s(second[1]) == pytest.approx(
        200 * Q8.kv_bytes_per_token * 8 / 200e9)
