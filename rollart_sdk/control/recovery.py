"""Engine recovery: a dead engine worker comes back, on the weights every engine serves.

When the LLMProxy sees an engine worker's process die (``mark_down``), its requests are
re-sent to the task's other engines (or the fallback) and this module waits for Ray to
restart the worker (engine actors run with ``max_restarts``). Once the restarted worker
answers, it is re-bound (its binding record gets the new process), loads the version
every other engine serves (``stage_weights`` + ``commit_weights``; under the pipeline's
weight-sync lock, so no update lands in between), starts receiving the version published
but not loaded yet (if any), and only then rejoins the routes.
A worker that does not come back within ``restart_timeout_s`` stays out; if that leaves
a task without engines, the watchdog stops the run with the reason.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from rollart_sdk.control.proxy import LLMProxy


class EngineRecovery:
    def __init__(self, proxy: LLMProxy, sync_lock: asyncio.Lock,
                 manifest: Callable[[], Any], engine_version: Callable[[], int],
                 staged: Callable[[], Any] | None = None,
                 rebind: Callable[[str], None] | None = None,
                 emit: Callable[[dict[str, Any]], None] | None = None,
                 restart_timeout_s: float = 300.0, poll_s: float = 2.0) -> None:
        self.proxy = proxy
        self.sync_lock = sync_lock
        self.manifest = manifest
        self.engine_version = engine_version
        self.staged = staged or (lambda: None)
        self.rebind = rebind
        self._emit = emit or (lambda e: None)
        self.restart_timeout_s = restart_timeout_s
        self.poll_s = poll_s
        self.deaths: Counter[str] = Counter()
        self.recovered: Counter[str] = Counter()
        self.failed: dict[str, str] = {}  # worker -> why it did not come back
        self._tasks: dict[str, asyncio.Task[None]] = {}
        proxy.on_worker_death.append(self._on_death)

    def _on_death(self, name: str, why: str) -> None:
        self.deaths[name] += 1
        self._emit({"trajectory": None, "tag": None, "span": "worker_died", "worker": name,
                    "t0": time.time(), "t1": time.time(), "error": why[:500]})
        if name not in self._tasks or self._tasks[name].done():
            self._tasks[name] = asyncio.ensure_future(self._recover(name))

    async def _recover(self, name: str) -> None:
        worker = self.proxy.worker(name)
        deadline = time.monotonic() + self.restart_timeout_s
        while True:
            try:
                await asyncio.wait_for(worker.call("version"), 10)
                break
            except Exception as exc:  # noqa: BLE001 - still restarting; give up at the deadline
                if time.monotonic() > deadline:
                    self.failed[name] = f"not restarted within {self.restart_timeout_s:g}s: " \
                                        f"{type(exc).__name__}: {exc}"[:500]
                    return
                await asyncio.sleep(self.poll_s)
        if self.rebind is not None:
            try:
                await asyncio.to_thread(self.rebind, name)
            except Exception as exc:  # noqa: BLE001 - the record is informative; serve anyway
                self._emit({"trajectory": None, "tag": None, "span": "rebind_failed",
                            "worker": name, "t0": time.time(), "t1": time.time(),
                            "error": f"{type(exc).__name__}: {exc}"[:500]})
        async with self.sync_lock:
            target = self.engine_version()
            manifest = self.manifest()
            if target > 0:
                if manifest is None or manifest.version != target:
                    self.failed[name] = f"no manifest of version {target} to reload"
                    return
                await worker.call("stage_weights", manifest)
                report = await worker.call("commit_weights")
                if report.version != target:
                    self.failed[name] = f"reloaded version {report.version}, not {target}"
                    return
            nxt = self.staged()  # published, not loaded yet: receive it like the others
            if nxt is not None:
                await worker.call("stage_weights", nxt)
            self.proxy.mark_up(name)
        self.recovered[name] += 1
        self._emit({"trajectory": None, "tag": None, "span": "worker_rejoined", "worker": name,
                    "t0": time.time(), "t1": time.time(), "version": target})

    async def close(self) -> None:
        for t in self._tasks.values():
            t.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def summary(self) -> dict[str, Any]:
        return {"deaths": dict(self.deaths), "recovered": dict(self.recovered),
                "failed": dict(self.failed)}
