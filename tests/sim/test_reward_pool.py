"""The simulator's reward capacity (rollart_sdk.sim.reward_pool): a reserved pool is
held from its job's start to its end whatever the load; a serverless pool starts from
zero (a cold start before the first call is served), shares its instances between jobs
and goes back to zero. The R3 experiment's rows: the benchmark suite's
tests/test_paper.py."""

from __future__ import annotations

import asyncio

import pytest

from rollart_sdk.sim.clock import run_virtual
from rollart_sdk.sim.costs import Dist
from rollart_sdk.sim.reward_pool import RewardPool
from rollart_sdk.testing.reward import make_request

TWO_S = Dist(kind="const", mean=2.0)


def _calls(pool: RewardPool, at: list[float], end: float) -> list[float]:
    """Calls at virtual times ``at``; the pool closed at ``end``; each call's latency."""
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        pool.open(loop.time())

        async def one(t: float) -> float:
            await asyncio.sleep(t)
            t0 = loop.time()
            await pool.score(make_request())
            return loop.time() - t0

        out = await asyncio.gather(*(one(t) for t in at))
        await asyncio.sleep(max(0.0, end - loop.time()))
        pool.close(loop.time())
        return list(out)

    return run_virtual(main())[0]


def test_a_reserved_pool_is_held_for_the_whole_run_and_queues_beyond_capacity():
    pool = RewardPool(TWO_S, mode="reserved", instances=2, concurrency=1)
    latencies = _calls(pool, [0.0, 0.0, 0.0, 50.0], end=100.0)
    assert sorted(latencies) == pytest.approx([2.0, 2.0, 2.0, 4.0])  # the third waited
    u = pool.usage()
    assert u["reserved_s"] == pytest.approx(200.0) and u["cold_starts"] == 0
    assert u["busy_s"] == pytest.approx(8.0) and u["utilisation"] == pytest.approx(0.04)


def test_a_serverless_pool_scales_from_zero_and_back():
    pool = RewardPool(TWO_S, mode="serverless", concurrency=4, target_ongoing=4,
                      cold_s=10.0, keep_warm_s=20.0, downscale_delay_s=5.0)
    latencies = _calls(pool, [0.0, 0.5, 100.0], end=200.0)
    # The first calls wait for a cold start (about 1 s to notice + 10 s); the instance
    # is reclaimed 20 s after it went idle, so the call at 100 s cold-starts again.
    assert latencies[0] >= 10.0 and latencies[2] >= 10.0
    u = pool.usage()
    assert u["cold_starts"] == 2 and u["instances"] == 2
    assert all(i.ended is not None for i in pool.pool)
    # Each instance: 10 s start + 2 s busy + 10 s until the look-back mean is 0 + 20 s
    # warm = 42 s, far less than the 200 s run; busy 2 s each.
    assert u["reserved_s"] == pytest.approx(84.0, abs=2.0)
    assert u["busy_s"] == pytest.approx(4.0, abs=0.6)
