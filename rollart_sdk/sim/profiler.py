"""Online affinity profiler (the paper's stated future work, section 9).

During a run each engine reports, per task tag, the seconds it spent in prefill and in
decode and the tokens of each (``stats()``: ``tag_prefill_s``, ``tag_decode_s``,
``tag_tokens``; the ``sim`` engine does, a real engine that reports them works too).
:func:`profile` turns those into, per hardware class, seconds per prefill token and per
decode token, and per task, the prefill and decode tokens it asks for. :func:`propose`
then assigns each task to the generation pool that minimises the busiest pool's load
(load = the task's tokens x the pool's seconds per token / the pool's engines), trying
every assignment (tasks are few), and reports the prefill/decode time ratio a PD
deployment would split the devices by.

A class that never served prefill (or decode) of any task borrows the rate scaled by the
classes' roofline ratio (FLOP/s for prefill, bandwidth for decode) from a class that did.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Profile:
    """What a run measured: per hardware class, seconds per prefill / decode token; per
    task, prefill and decode tokens; per pool, its hardware and engine count."""

    prefill_s_per_token: dict[str, float] = field(default_factory=dict)
    decode_s_per_token: dict[str, float] = field(default_factory=dict)
    task_tokens: dict[str, tuple[float, float]] = field(default_factory=dict)
    pools: dict[str, tuple[str, int]] = field(default_factory=dict)  # pool -> (hw, engines)
    prefill_s: float = 0.0
    decode_s: float = 0.0


@dataclass
class Proposal:
    hw_mapping: dict[str, str]  # task tag -> pool
    load_s: dict[str, float]  # pool -> estimated seconds of work per engine
    current_load_s: dict[str, float]
    prefill_decode_ratio: float  # prefill seconds / decode seconds over the workload

    def to_json(self) -> dict[str, Any]:
        return {"hw_mapping": self.hw_mapping, "load_s": self.load_s,
                "current_load_s": self.current_load_s,
                "prefill_decode_ratio": self.prefill_decode_ratio}


def profile(engine_stats: list[dict[str, Any]], roofline: dict[str, tuple[float, float]] | None = None
            ) -> Profile:
    """``engine_stats``: each engine's ``stats()`` plus ``pool`` and ``hardware``;
    ``roofline``: hardware -> (FLOP/s, bandwidth), to fill a rate a class lacks."""
    p = Profile()
    sums: dict[str, list[float]] = {}  # hw -> [prefill s, prefill tok, decode s, decode tok]
    for st in engine_stats:
        hw, pool = st["hardware_name"], st["pool"]
        hw_n = p.pools.get(pool, (hw, 0))[1]
        p.pools[pool] = (hw, hw_n + 1)
        acc = sums.setdefault(hw, [0.0, 0.0, 0.0, 0.0])
        for tag, (pre_tok, dec_tok) in st.get("tag_tokens", {}).items():
            pre_s = st.get("tag_prefill_s", {}).get(tag, 0.0)
            dec_s = st.get("tag_decode_s", {}).get(tag, 0.0)
            acc[0] += pre_s
            acc[1] += pre_tok
            acc[2] += dec_s
            acc[3] += dec_tok
            old = p.task_tokens.get(tag, (0.0, 0.0))
            p.task_tokens[tag] = (old[0] + pre_tok, old[1] + dec_tok)
            p.prefill_s += pre_s
            p.decode_s += dec_s
    for hw, (ps, pt, ds, dt) in sums.items():
        if pt:
            p.prefill_s_per_token[hw] = ps / pt
        if dt:
            p.decode_s_per_token[hw] = ds / dt
    for rates, which in ((p.prefill_s_per_token, 0), (p.decode_s_per_token, 1)):
        for hw in sums:
            if hw in rates or not rates or roofline is None:
                continue
            ref = next(iter(rates))
            rates[hw] = rates[ref] * roofline[ref][which] / roofline[hw][which]
    return p


def propose(p: Profile, current: dict[str, str]) -> Proposal:
    """The task -> pool assignment with the smallest busiest-pool load."""
    tags = sorted(p.task_tokens)
    pools = sorted(p.pools)

    def loads(mapping: dict[str, str]) -> dict[str, float]:
        out = {pool: 0.0 for pool in pools}
        for tag, pool in mapping.items():
            hw, n = p.pools[pool]
            pre, dec = p.task_tokens[tag]
            cost = (pre * p.prefill_s_per_token.get(hw, 0.0)
                    + dec * p.decode_s_per_token.get(hw, 0.0))
            out[pool] += cost / n
        return out

    best: dict[str, str] | None = None
    best_load = float("inf")
    for choice in itertools.product(pools, repeat=len(tags)):
        mapping = dict(zip(tags, choice, strict=True))
        peak = max(loads(mapping).values())
        if peak < best_load - 1e-12:
            best, best_load = mapping, peak
    assert best is not None
    ratio = p.prefill_s / p.decode_s if p.decode_s else float("inf")
    return Proposal(best, loads(best), loads({t: current[t] for t in tags if t in current}),
                    ratio)
