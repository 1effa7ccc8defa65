"""Engine recovery: a dead engine worker comes back, on the weights every engine serves.

When the LLMProxy (or WeightSync) sees an engine worker's process die (``mark_down``), its
requests are re-sent to the task's other engines (or the fallback) and this module waits
for Ray to restart the worker (engine actors run with ``max_restarts`` and no task
retries: ``rollart_sdk.job.ENGINE_MAX_RESTARTS``). A restarted process holds the model's
initial weights and refuses requests and weight updates (``EngineRestartedError``, seen as
a dead worker) until it is reloaded. Once it answers, it is re-bound (its binding record
counts the restart; ``bindings.json`` is rewritten), loads the version every other engine
serves and starts receiving the version published but not loaded yet, if any
(``EngineWorker.reload``; under the weight-update lock, so no update lands in between;
both manifests marked as a reload by one engine: :func:`for_reload`),
and only then rejoins the routes. One that dies again while reloading is waited for again;
a reload that fails otherwise (the served version was released by its sender meanwhile:
transports keep only their newest few) is tried again once the engines serve a newer one.
A worker that does not come back within ``restart_timeout_s`` stays out (``failed`` in the
summary); if that leaves a task without engines, the watchdog stops the run with the
reason. At the end of a completed run, a recovery in progress may finish (bounded: the
Pipeline's ``RECOVERY_WAIT_S``).

What it reads it is given at construction: the run's
:class:`~rollart_sdk.control.weight_updates.WeightUpdates` (the served and the staged
manifest, the weight-update lock, the engines' version) and ``rebind``, the composition
root's re-binding of a restarted worker (``job/build.py``: the spawner's record and
``bindings.json``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from rollart_sdk.control.aio import wait_for
from rollart_sdk.control.proxy import LLMProxy
from rollart_sdk.control.weight_updates import WeightUpdates
from rollart_sdk.types import WeightManifest


def for_reload(manifest: WeightManifest | None) -> WeightManifest | None:
    """The manifest as one restarted engine fetches it alone, outside the round the other
    engines took part in: ``meta["receivers"] = 1`` and ``meta["reload"]`` (a push
    transport, e.g. nccl, then has its sender send that version to this engine only; a
    pull transport reads the stored version as always)."""
    if manifest is None:
        return None
    return dataclasses.replace(manifest, meta={**manifest.meta, "receivers": 1, "reload": True})


class EngineRecovery:
    def __init__(self, proxy: LLMProxy, weights: WeightUpdates,
                 rebind: Callable[[str], None] | None = None,
                 emit: Callable[[dict[str, Any]], None] | None = None,
                 restart_timeout_s: float = 300.0, poll_s: float = 2.0,
                 say: Callable[[str], None] | None = None) -> None:
        self.proxy = proxy
        self.weights = weights
        self.sync_lock = weights.lock  # no weight update lands while an engine reloads
        self._rebind = rebind
        self._emit = emit or (lambda e: None)
        self._say = say or (lambda line: None)  # one console line per death, return, loss
        self._died_at: dict[str, float] = {}  # worker -> monotonic time of its last death
        self.restart_timeout_s = restart_timeout_s
        self.poll_s = poll_s
        self.deaths: Counter[str] = Counter()
        self.recovered: Counter[str] = Counter()
        self.failed: dict[str, str] = {}  # worker -> why it did not come back
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closing = False  # the run ended: a recovery in progress may still finish
        proxy.on_worker_death.append(self._on_death)

    def _on_death(self, name: str, why: str) -> None:
        self.deaths[name] += 1
        self._emit({"trajectory": None, "tag": None, "span": "worker_died", "worker": name,
                    "t0": time.time(), "t1": time.time(), "error": why[:500]})
        recovering = name in self._tasks and not self._tasks[name].done()
        if not recovering:
            self._died_at[name] = time.monotonic()
        cause = why.strip().splitlines()[0][:200] if why.strip() else "no reason given"
        others = [w for w in self.proxy.workers if w not in self.proxy.down]
        where = ("re-sent to the other engines" if others else
                 "held until it is back (no other engine is up)")
        self._say(f"engine {name} died ({cause}); its requests are {where}; waiting for "
                  f"it to restart (up to {self.restart_timeout_s:g} s)")
        if not recovering:
            self._tasks[name] = asyncio.ensure_future(self._recover(name))

    async def _recover(self, name: str) -> None:
        from rollart_sdk.errors import is_worker_death

        deadline = time.monotonic() + self.restart_timeout_s
        rebound = False
        while True:
            try:
                rebound = await self._recover_once(name, deadline, rebound)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - recorded; the run goes on without it
                why = f"reload failed: {type(exc).__name__}: {exc}"[:500]
                # Past the deadline, or the run is over (no newer version will come).
                if time.monotonic() >= deadline or self._closing:
                    self.failed[name] = why
                    self._lost(name)
                    return
                if is_worker_death(exc):
                    rebound = False
                    continue  # it died again while reloading: wait for the next restart
                # E.g. the served version was released by its sender meanwhile (it keeps
                # only its newest few): try again once the engines serve a newer one.
                self._emit({"trajectory": None, "tag": None, "span": "reload_retry",
                            "worker": name, "t0": time.time(), "t1": time.time(),
                            "error": why})
                served = self.weights.engine
                while (self.weights.engine == served and time.monotonic() < deadline
                       and not self._closing):
                    await asyncio.sleep(self.poll_s)

    async def _recover_once(self, name: str, deadline: float, rebound: bool) -> bool:
        """Wait for the restarted process, re-bind it (once per restart), reload it and
        put it back in the routes. Returns whether it was re-bound."""
        worker = self.proxy.worker(name)
        while True:
            try:
                state = await wait_for(worker.engine.restart_state(), 10)
                break
            except Exception as exc:  # noqa: BLE001 - still restarting; give up at the deadline
                if any(c.__name__ == "EngineLostError" for c in type(exc).__mro__):
                    self.failed[name] = f"{type(exc).__name__}: {exc}"[:500]
                    self._lost(name)  # its engine died where nothing restarts it
                    return rebound
                if time.monotonic() > deadline:
                    self.failed[name] = f"not restarted within {self.restart_timeout_s:g}s: " \
                                        f"{type(exc).__name__}: {exc}"[:500]
                    self._lost(name)
                    return rebound
                await asyncio.sleep(self.poll_s)
        if state["restarted"] and not rebound and self._rebind is not None:
            rebound = True
            try:
                await asyncio.to_thread(self._rebind, name)
            except Exception as exc:  # noqa: BLE001 - the record is informative; serve anyway
                self._emit({"trajectory": None, "tag": None, "span": "rebind_failed",
                            "worker": name, "t0": time.time(), "t1": time.time(),
                            "error": f"{type(exc).__name__}: {exc}"[:500]})
        async with self.sync_lock:  # no weight update lands while it reloads
            target = self.weights.engine
            manifest = self.weights.served_manifest() if target > 0 else None
            if target > 0 and (manifest is None or manifest.version != target):
                raise LookupError(f"no manifest of the served version {target} to reload")
            # The served version, then the one published and not loaded yet (if any).
            # Bounded by the restart deadline: a reload that stalls must not hold the
            # weight-update lock (and with it every later update) for ever.
            limit = max(1.0, deadline - time.monotonic())
            try:
                loaded = await wait_for(
                    worker.engine.reload(for_reload(manifest),
                                         for_reload(self.weights.staged_manifest())),
                    limit)
            except TimeoutError:
                raise TimeoutError(f"the reload did not finish within {limit:.0f}s "
                                   "(restart_timeout_s)") from None
            if loaded != target:
                raise RuntimeError(f"reloaded version {loaded}, not the served {target}")
            self.proxy.mark_up(name)
        self.failed.pop(name, None)
        self.recovered[name] += 1
        took = time.monotonic() - self._died_at.get(name, time.monotonic())
        self._say(f"engine {name} is back after {took:.1f} s, serving version {target}")
        self._emit({"trajectory": None, "tag": None, "span": "worker_rejoined", "worker": name,
                    "t0": time.time(), "t1": time.time(), "version": target,
                    "restarted": bool(state["restarted"])})
        return rebound

    def _lost(self, name: str) -> None:
        self._say(f"warning: engine {name} is out for the rest of the run: "
                  f"{self.failed[name]}")
        self._emit({"trajectory": None, "tag": None, "span": "worker_lost", "worker": name,
                    "t0": time.time(), "t1": time.time(), "error": self.failed[name]})

    def in_progress(self) -> list[str]:
        """Engines being recovered now."""
        return [n for n, t in self._tasks.items() if not t.done()]

    async def close(self, wait_s: float = 0.0) -> None:
        """Stop recovering; a recovery in progress may first finish within ``wait_s`` (at
        the end of a completed run: the restarted engine then ends on the version every
        engine serves); past it, it is reported as not back."""
        self._closing = True
        pending = [t for t in self._tasks.values() if not t.done()]
        if pending and wait_s > 0:
            await asyncio.wait(pending, timeout=wait_s)
        for t in self._tasks.values():
            t.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        for name, t in self._tasks.items():
            if t.cancelled():
                self.failed.setdefault(name, "the run ended before it was back")

    def summary(self) -> dict[str, Any]:
        return {"deaths": dict(self.deaths), "recovered": dict(self.recovered),
                "failed": dict(self.failed)}
