"""EngineRecovery against in-process workers: a reload that stalls gives the weight-update
lock back at the restart deadline and the engine is reported lost with the reason."""

from __future__ import annotations

import asyncio

from rollart_sdk.control.handles import WorkerHandle
from rollart_sdk.control.proxy import LLMProxy
from rollart_sdk.control.recovery import EngineRecovery
from rollart_sdk.control.versions import PolicyVersions
from rollart_sdk.control.weight_updates import WeightUpdates


class StallingEngine:
    """Restarted (answers restart_state) but its reload never returns."""

    def __init__(self, stall: bool) -> None:
        self.stall = stall
        self.reloads = 0

    async def restart_state(self):
        return {"restarted": True}

    async def reload(self, manifest, staged):
        self.reloads += 1
        if self.stall:
            await asyncio.sleep(3600)
        return 0


def run(stall: bool):
    async def main():
        engine = StallingEngine(stall)
        proxy = LLMProxy([WorkerHandle("e0", engine, pool="P", is_ray=False)], {"default": ["e0"]})
        weights = WeightUpdates(None, None, PolicyVersions(), mode="async",  # type: ignore[arg-type]
                                alpha=1, defer=False, log=[], emit=lambda e: None)
        lock = weights.lock
        rec = EngineRecovery(proxy, weights, restart_timeout_s=1.5, poll_s=0.05)
        proxy.mark_down("e0", "test: killed")
        await asyncio.wait_for(rec._tasks["e0"], 10)
        # The weight-update lock is free again either way.
        await asyncio.wait_for(lock.acquire(), 1)
        return engine, proxy, rec

    return asyncio.run(main())


def test_a_reload_that_stalls_releases_the_lock_and_is_reported_lost():
    engine, proxy, rec = run(stall=True)
    assert engine.reloads == 1
    assert "e0" in proxy.down and rec.recovered["e0"] == 0
    assert "reload failed: TimeoutError: the reload did not finish" in rec.failed["e0"]


def test_a_reload_that_returns_rejoins():
    engine, proxy, rec = run(stall=False)
    assert "e0" not in proxy.down and rec.recovered["e0"] == 1 and not rec.failed
