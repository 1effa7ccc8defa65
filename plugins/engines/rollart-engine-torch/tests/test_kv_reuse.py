"""Multi-turn KV reuse, ABORT before ADD, and the prefill-decode (PD) KV hand-off."""

from __future__ import annotations

import asyncio

import torch
from rollart_engine_torch.engine import TorchEngine

from rollart_sdk.algorithms import policy_logprob
from rollart_sdk.types import GenerationRequest, SamplingParams, WeightBucket


def _turn(rid: str, prompt: list[int], traj: str = "", **sampling) -> GenerationRequest:
    return GenerationRequest(rid, list(prompt), SamplingParams(**sampling), trajectory_id=traj)


async def _dialogue(engine: TorchEngine, traj: str, turns: int, seed: int) -> tuple[list, list]:
    """A multi-turn trajectory: each prompt is the previous context + the engine's
    answer + a new 'observation'."""
    context = [7 + seed, 8, 9, 10, 11]
    results = []
    for t in range(turns):
        res = await engine.generate(_turn(f"{traj}/t{t}", context, traj, seed=seed * 100 + t,
                                          max_new_tokens=3))
        results.append((list(context), res))
        context = context + res.token_ids + [20 + t, 21, 22 + seed]
    return results, context


def test_kv_kept_between_turns_computes_only_new_tokens(tiny_model, reference):
    """Turn k+1 computes only its new tokens, and samples exactly what a fresh engine
    without reuse samples (same seeds), with logprobs equal to a teacher-forced pass."""

    async def run(reuse: bool):
        engine = TorchEngine(model=tiny_model, max_running=4, eos_token_ids=[], reuse_kv=reuse)
        out = await asyncio.gather(*(_dialogue(engine, f"traj{i}", 4, i) for i in range(3)))
        stats = engine.stats()
        released = await engine.release("traj0")
        after = engine.stats()
        await engine.shutdown()
        return out, stats, released, after

    with_reuse, s_reuse, released, after = asyncio.run(run(True))
    without, s_plain, _, _ = asyncio.run(run(False))
    for (turns_a, _), (turns_b, _) in zip(with_reuse, without, strict=True):
        for (prompt, ra), (_, rb) in zip(turns_a, turns_b, strict=True):
            assert ra.token_ids == rb.token_ids
            ref = reference(prompt, ra.token_ids)
            assert max(abs(a - b) for a, b in zip(ra.logprobs, ref, strict=True)) < 1e-4
    assert s_plain["reused_tokens"] == 0
    # every turn after the first reuses its whole previous context but the last token
    assert s_reuse["reused_tokens"] > 0
    assert s_reuse["prefill_tokens"] + s_reuse["reused_tokens"] == s_plain["prefill_tokens"]
    assert s_reuse["prefill_tokens"] < s_plain["prefill_tokens"] / 2
    assert s_reuse["kv_idle"] == 3 and released and after["kv_idle"] == 2


def test_weight_update_drops_kept_kv(tiny_model, other_weights):
    """After load_weights the kept KV (old policy) is not reused: the next turn is
    computed in full under the new weights."""

    async def run():
        engine = TorchEngine(model=tiny_model, max_running=2, eos_token_ids=[])
        first = await engine.generate(_turn("a/t0", [5, 6, 7], "a", seed=1, max_new_tokens=2))
        assert engine.stats()["kv_idle"] == 1
        await engine.load_weights([WeightBucket(1, 0, dict(other_weights))], version=1)
        idle = engine.stats()["kv_idle"]
        before = engine.stats()["reused_tokens"]
        prompt = [5, 6, 7, *first.token_ids, 9]
        second = await engine.generate(_turn("a/t1", prompt, "a", seed=2, max_new_tokens=2))
        stats = engine.stats()
        await engine.shutdown()
        return idle, before, stats, prompt, second

    idle, before, stats, prompt, second = asyncio.run(run())
    assert idle == 0 and stats["reused_tokens"] == before
    from rollart_sdk.models import load_causal_lm

    model = load_causal_lm(tiny_model.path)
    model.load_state_dict(other_weights)
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([prompt + second.token_ids])).logits[0], -1)
    ref = [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(second.token_ids)]
    assert max(abs(a - b) for a, b in zip(second.logprobs, ref, strict=True)) < 1e-4


def test_eviction_under_slot_pressure(tiny_model, reference):
    """More trajectories than slots: the least recently used kept KV is evicted and that
    trajectory's next turn is recomputed, still correct."""

    async def run():
        engine = TorchEngine(model=tiny_model, max_running=2, kv_slots=3, eos_token_ids=[])
        out = await asyncio.gather(*(_dialogue(engine, f"t{i}", 3, i) for i in range(5)))
        stats = engine.stats()
        await engine.shutdown()
        return out, stats

    out, stats = asyncio.run(run())
    assert stats["kv_evicted"] > 0 and stats["kv_idle"] <= 3
    for turns, _ in out:
        for prompt, res in turns:
            ref = reference(prompt, res.token_ids)
            assert max(abs(a - b) for a, b in zip(res.logprobs, ref, strict=True)) < 1e-4


def test_abort_before_add_is_honoured(tiny_model):
    """An ABORT that overtakes its ADD is remembered: the ADD returns "abort" at once and
    uses no slot; the memory is bounded."""

    async def run():
        engine = TorchEngine(model=tiny_model, max_running=1, eos_token_ids=[], abort_memory=2)
        known = await engine.abort("early")
        res = await asyncio.wait_for(
            engine.generate(_turn("early", [3, 4], max_new_tokens=50)), 10)
        # bounded: the oldest remembered ids are forgotten
        for rid in ("x1", "x2", "x3"):
            await engine.abort(rid)
        forgotten = await asyncio.wait_for(
            engine.generate(_turn("x1", [3, 4], temperature=0.0, max_new_tokens=2)), 30)
        remembered = await engine.generate(_turn("x3", [3, 4], max_new_tokens=2))
        stats = engine.stats()
        await engine.shutdown()
        return known, res, forgotten, remembered, stats

    known, res, forgotten, remembered, stats = asyncio.run(run())
    assert known is False
    assert res.finish_reason == "abort" and res.token_ids == []
    assert forgotten.finish_reason == "length" and len(forgotten.token_ids) == 2
    assert remembered.finish_reason == "abort"
    assert stats["aborted"] == 2 and stats["running"] == 0


def test_pd_handoff_equals_single_engine(tiny_model, reference):
    """Prefill on one engine, decode on another with the hand-off: the same tokens as
    one engine doing both, with the same seeds; the decode side computed only the last
    prompt token."""

    prompts = [[(3 * i + j) % 80 + 5 for j in range(6 + 4 * i)] for i in range(4)]

    async def run():
        solo = TorchEngine(model=tiny_model, max_running=4, eos_token_ids=[])
        pre = TorchEngine(model=tiny_model, max_running=4, eos_token_ids=[])
        dec = TorchEngine(model=tiny_model, max_running=4, eos_token_ids=[])
        reqs = [_turn(f"r{i}", p, seed=i, max_new_tokens=5) for i, p in enumerate(prompts)]
        base = await asyncio.gather(*(solo.generate(r) for r in reqs))
        kvs = await asyncio.gather(*(pre.prefill_kv(r) for r in reqs))
        pd = await asyncio.gather(*(dec.generate(r, kv=kv) for r, kv in zip(reqs, kvs, strict=True)))
        stats = dec.stats(), pre.stats()
        for e in (solo, pre, dec):
            await e.shutdown()
        return base, kvs, pd, stats

    base, kvs, pd, (dec_stats, pre_stats) = asyncio.run(run())
    for p, kv, a, b in zip(prompts, kvs, base, pd, strict=True):
        assert kv.tokens == p[:-1] and kv.k.shape[2] == len(p) - 1
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(b.logprobs, reference(p, b.token_ids), strict=True)) < 1e-4
    assert dec_stats["reused_tokens"] == sum(len(p) - 1 for p in prompts)
    assert pre_stats["tokens_generated"] == 0 and pre_stats["running"] == 0


def test_identical_rows_of_a_step_are_computed_once(tiny_model, reference_logits):
    """Trajectories with the same context (a group's shared prompt, the same actions so
    far) are computed once per step and copied: same tokens and logprobs as computing
    each on its own (one episode after another), fewer prefill tokens."""

    async def episode(engine: TorchEngine, traj: str, seed: int) -> list:
        context = [5, 6, 7, 8]
        out = []
        for t in range(3):
            res = await engine.generate(_turn(f"{traj}/t{t}", context, traj, seed=seed * 10 + t,
                                              max_new_tokens=1, allowed_token_ids=[3, 4]))
            out.append((list(context), res))
            context = context + res.token_ids + [20, 21 + res.token_ids[0]]
        return out

    async def run(together: bool):
        engine = TorchEngine(model=tiny_model, max_running=6, eos_token_ids=[])
        if together:
            out = await asyncio.gather(*(episode(engine, f"e{i}", i) for i in range(6)))
        else:  # one episode after another: no two rows in one step
            out = [await episode(engine, f"e{i}", i) for i in range(6)]
        stats = engine.stats()
        await engine.shutdown()
        return out, stats

    shared, s_shared = asyncio.run(run(True))
    alone, s_alone = asyncio.run(run(False))
    for a, b in zip(shared, alone, strict=True):
        for (prompt, ra), (_, rb) in zip(a, b, strict=True):
            assert ra.token_ids == rb.token_ids
            assert ra.logprobs == rb.logprobs or max(
                abs(x - y) for x, y in zip(ra.logprobs, rb.logprobs, strict=True)) < 1e-5
            # the sampled policy: temperature 1, masked to the allowed ids [3, 4]
            rows = reference_logits(prompt, ra.token_ids)
            ref = [policy_logprob(rows[i], t, 1.0, torch.tensor([3, 4]))
                   for i, t in enumerate(ra.token_ids)]
            assert max(abs(x - y) for x, y in zip(ra.logprobs, ref, strict=True)) < 1e-4
    assert s_alone["shared_tokens"] == 0
    # the first turn's prompt is the same for all six: computed once, copied five times
    assert s_shared["shared_tokens"] >= 5 * 3
    assert s_shared["prefill_tokens"] + s_shared["shared_tokens"] == s_alone["prefill_tokens"]


async def _pd_dialogues(pre: TorchEngine, dec: TorchEngine, turns: int,
                        hand_back: bool = True) -> list[dict]:
    """Two trajectories, their turns interleaved, with PD as the LLMProxy runs it: each
    turn's prompt goes through ``pre.prefill_kv`` (told what ``dec`` kept of the
    trajectory, its last result's ``kv_kept``, and given the answer's K/V from
    ``dec.export_kv``, unless not ``hand_back``) and is decoded by ``dec``. One record per
    turn with the engines' counter deltas; each answer is 3 tokens, each observation 3."""
    contexts = {t: [7 + i, 8, 9, 10, 11, 12 + i] for i, t in enumerate(("a", "b"))}
    held: dict[str, tuple] = {}
    records = []
    for turn in range(turns):
        for i, traj in enumerate(contexts):
            prompt = contexts[traj]
            seed = 10 * i + turn
            req = _turn(f"{traj}/t{turn}", prompt, traj, seed=seed, max_new_tokens=3)
            kept, version, pre_has = held.get(traj, (0, None, 0))
            answer = await dec.export_kv(traj, pre_has) if hand_back and kept else None
            pre0, dec0 = pre.stats(), dec.stats()
            kv = await pre.prefill_kv(req, kept, version, answer)
            res = await dec.generate(req, kv=kv)
            pre1, dec1 = pre.stats(), dec.stats()
            held[traj] = (res.kv_kept, res.versions[-1], len(prompt) - 1)
            records.append({
                "traj": traj, "turn": turn, "prompt": list(prompt), "seed": seed,
                "result": res, "kv": kv, "answer": answer,
                "prefill_computed": pre1["prefill_tokens"] - pre0["prefill_tokens"],
                "prefill_short": pre1["handoff_short"] - pre0["handoff_short"],
                "decode_computed": dec1["prefill_tokens"] - dec0["prefill_tokens"],
                "decode_served": dec1["reused_tokens"] - dec0["reused_tokens"],
                "short": dec1["handoff_short"] - dec0["handoff_short"],
            })
            contexts[traj] = prompt + res.token_ids + [30 + turn, 31, 32]  # the observation
    return records


def test_pd_multi_turn_prefills_only_new_tokens_and_keeps_decode_kv(tiny_model, reference):
    """PD over turns: the prefill engine computes only each turn's observation (its own
    kept K/V hold the earlier prompt, the decode engine's hand-back the last answer); only
    the observation's K/V travel to the decode engine, which keeps its K/V between turns
    and computes nothing but each prompt's last token. Without the hand-back the prefill
    engine computes the answer too. Tokens equal one engine without PD."""

    async def run(hand_back: bool):
        pre = TorchEngine(model=tiny_model, max_running=4, eos_token_ids=[])
        dec = TorchEngine(model=tiny_model, max_running=4, eos_token_ids=[])
        records = await _pd_dialogues(pre, dec, 4, hand_back)
        stats = pre.stats(), dec.stats()
        solo = TorchEngine(model=tiny_model, max_running=4, eos_token_ids=[], reuse_kv=False)
        base = [await solo.generate(_turn(f"solo/{r['traj']}{r['turn']}", r["prompt"],
                                          seed=r["seed"], max_new_tokens=3))
                for r in records]
        for e in (pre, dec, solo):
            await e.shutdown()
        return records, stats, base

    records, (pre_stats, dec_stats), base = asyncio.run(run(True))
    previous: dict[str, dict] = {}
    for r, b in zip(records, base, strict=True):
        res, kv, prompt = r["result"], r["kv"], r["prompt"]
        assert res.token_ids == b.token_ids  # PD with kept caches samples what one engine does
        assert max(abs(x - y) for x, y in
                   zip(res.logprobs, reference(prompt, res.token_ids), strict=True)) < 1e-4
        last = previous.get(r["traj"])
        # The decode engine kept the whole context but the last sampled token's K/V, and
        # handed back what the prefill engine lacked: the last prompt token + the answer.
        assert res.kv_kept == len(prompt) + len(res.token_ids) - 1
        if last is not None:
            assert r["answer"].start == len(last["prompt"]) - 1 and r["answer"].carried == 3
        if last is None:
            assert r["prefill_computed"] == len(prompt) - 1 and kv.start == 0
        else:
            assert r["prefill_computed"] == 3  # the observation only
            assert kv.start == last["result"].kv_kept  # what the decode engine holds
            assert kv.carried == 3 and kv.k.shape[2] == 3  # only the observation's K/V
        assert r["decode_computed"] == 0 and r["short"] == 0 and r["prefill_short"] == 0
        assert r["decode_served"] == len(prompt) - 1  # kept cache + hand-off, nothing computed
        previous[r["traj"]] = r
    assert pre_stats["kv_idle"] == 2 and dec_stats["kv_idle"] == 2
    assert pre_stats["handoff_tokens_out"] == sum(r["kv"].carried for r in records)
    assert pre_stats["tokens_generated"] == 0
    no_back, _, _ = asyncio.run(run(False))
    assert [r["result"].token_ids for r in no_back] == [r["result"].token_ids for r in records]
    # Without the hand-back: the answer (3) and the observation (3) each turn.
    assert [r["prefill_computed"] for r in no_back if r["turn"]] == [6] * 6


def test_pd_multi_turn_after_eviction(tiny_model):
    """A prefill engine that lost a trajectory's cache (one KV slot, two trajectories)
    recomputes the evicted prefix (the answer handed back cannot continue it), still
    sending only what the decode engine lacks; a decode engine that lost its cache ignores
    the short hand-off, computes what it lacks itself and has no answer to hand back.
    Same tokens either way."""

    async def run(pre_slots: int, dec_slots: int):
        pre = TorchEngine(model=tiny_model, max_running=1, kv_slots=pre_slots, eos_token_ids=[])
        dec = TorchEngine(model=tiny_model, max_running=1, kv_slots=dec_slots, eos_token_ids=[])
        records = await _pd_dialogues(pre, dec, 3)
        for e in (pre, dec):
            await e.shutdown()
        return records

    kept = asyncio.run(run(4, 4))
    pre_evicts = asyncio.run(run(1, 4))
    dec_evicts = asyncio.run(run(4, 1))
    tokens = [[r["result"].token_ids for r in rs] for rs in (kept, pre_evicts, dec_evicts)]
    assert tokens[0] == tokens[1] == tokens[2]
    for r in pre_evicts:  # the other trajectory took the one slot: the whole prefix again
        assert r["prefill_computed"] == len(r["prompt"]) - 1
        assert r["prefill_short"] == (r["turn"] > 0)  # the hand-back had nothing to extend
        assert r["kv"].carried == (len(r["prompt"]) - 1 if r["turn"] == 0 else 3)
        assert r["decode_computed"] == 0
    for r in dec_evicts[2:]:  # turns after the first: the decode cache was evicted
        assert r["short"] == 1 and r["decode_computed"] == len(r["prompt"]) - 1
        # nor an answer to hand back: the prefill engine computes it (3) + the observation
        assert r["answer"] is None and r["prefill_computed"] == 6
