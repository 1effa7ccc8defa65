"""Deferred weight updates on the real pipeline, for any transport (core and plugin tests).

``run_gated(tmp_path, transport, ...)`` runs a small in-process training job (torch
trainer and two torch engines, FrozenLake and Arithmetic, ``build_job(in_process=True)``)
with ``transport`` moving every version, and holds back each version's transfer on every
engine (:class:`GatedTransport`, wrapping the engine's real receiving transport) until the
pipeline has logged that it deferred that version (``defer:v``), and then until the
engines completed a generation request (at most ``linger_s``: admission control may have
nothing in flight). A pipeline that waited for the transfer at its suspend point never
opens the gate: the transfer fails after ``gate_timeout_s`` and the run fails.

``check_deferred(job, records)`` then asserts, from what the run recorded:

- every version from ``first`` on was deferred at a suspend point and committed at a
  later one, and the engines never served a version that was not committed everywhere;
- generation went on while each deferred version arrived: no suspend between the gate
  opening and the transfer's end, and requests completed in those windows;
- no trained trajectory violates the staleness bound: started at ``>=`` its batch's floor
  (trainer version - 1 - alpha) and every token from a version between its start and
  the version it was trained at.

Needs the torch engine and trainer, the frozenlake and arithmetic envs and the rule
reward plugins installed.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from typing import Any

from rollart_sdk.types import WeightBucket, WeightManifest

SMALL_RUN: dict[str, Any] = {
    "name": "deferred-weights",
    "seed": 0,
    "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                       "intermediate_size": 64}},
    "pools": [
        {"name": "H800", "hardware": "H800", "kind": "gpu", "profile": "compute", "count": 4},
        {"name": "H20", "hardware": "H20", "kind": "gpu", "profile": "bandwidth", "count": 4},
        {"name": "cpu", "hardware": "cpu", "kind": "cpu", "count": 8},
    ],
    "roles": {"actor_gen": {"workers": 2}},
    "tasks": [
        {"tag": "FrozenLake",
         "env": {"name": "frozenlake",
                 "options": {"desc": ["SFF", "FHF", "FFG"], "obs_format": "compact"}},
         "reward": {"name": "rule", "options": {"mode": "success"}},
         "affinity": "H800", "max_turns": 4, "constrain_actions": True,
         "system_prompt": None},
        {"tag": "Arithmetic",
         "env": {"name": "arithmetic", "options": {"num_digits": 1, "ops": ["+"]}},
         "reward": {"name": "rule", "options": {"mode": "exact_match"}},
         "affinity": "H20", "max_turns": 1, "system_prompt": None,
         "sampling": {"max_new_tokens": 4}},
    ],
    "engine": {"name": "torch", "options": {"max_running": 32}},
    "trainer": {"name": "torch", "options": {"lr": 0.003, "micro_batch_size": 16}},
    "transport": {"name": "local"},
    "rollout": {"batch_size": 8, "group_size": 4, "mode": "async", "alpha": 1},
    "train": {"steps": 4, "bucket_mb": 1},
}


class Gate:
    """Shared state of one job's gated transports."""

    def __init__(self, log: list[str], first: int, timeout_s: float,
                 linger_s: float = 2.0) -> None:
        self.log = log
        self.first = first
        self.timeout_s = timeout_s
        self.linger_s = linger_s
        self.generated: list[tuple[float, int]] = []  # (time, engine version) per request
        self.lock = threading.Lock()
        self.closed = threading.Event()
        # version -> engine -> (log index at opening, requests completed before the
        # transfer ended, log index at the transfer's end)
        self.windows: dict[int, dict[str, tuple[int, int, int]]] = {}

    def wait_open(self, version: int, name: str) -> tuple[int, int]:
        deadline = time.monotonic() + self.timeout_s
        while f"defer:{version}" not in self.log:
            self._check(deadline, version, name, "the pipeline to defer it")
        at = self.log.index(f"defer:{version}")
        n0 = len(self.generated)
        linger = time.monotonic() + self.linger_s
        while len(self.generated) <= n0 and time.monotonic() < linger:
            self._check(deadline, version, name, "a generation request to complete")
        return at, n0

    def _check(self, deadline: float, version: int, name: str, what: str) -> None:
        if self.closed.is_set():
            raise RuntimeError(f"gate of version {version} on {name}: the job closed")
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate of version {version} on {name}: waited "
                               f"{self.timeout_s:g}s for {what}")
        time.sleep(0.005)


class GatedTransport:
    """An engine's receiving transport whose ``fetch`` of version ``>= gate.first``
    starts only once the gate opens (see the module docstring)."""

    def __init__(self, inner: Any, gate: Gate, name: str) -> None:
        self.inner = inner
        self.gate = gate
        self.name = name
        self.style = getattr(inner, "style", "pull")

    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]:
        v = manifest.version
        if v < self.gate.first:
            yield from self.inner.fetch(manifest)
            return
        at, n0 = self.gate.wait_open(v, self.name)
        yield from self.inner.fetch(manifest)
        with self.gate.lock:
            self.gate.windows.setdefault(v, {})[self.name] = (
                at, len(self.gate.generated) - n0, len(self.gate.log))

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


def gate_job(job: Any, first: int = 2, timeout_s: float = 120.0) -> Gate:
    """Wrap every engine worker of an in-process ``job``: gated transfers, counted
    generation requests."""
    gate = Gate(job.pipeline.log, first, timeout_s)
    for handle in job.pipeline.proxy.workers.values():
        worker = handle.target
        worker.stager.transport = GatedTransport(worker.stager.transport, gate, handle.name)
        engine = worker.engine
        inner = engine.generate

        async def generate(request: Any, inner: Any = inner, engine: Any = engine) -> Any:
            result = await inner(request)
            with gate.lock:
                gate.generated.append((time.monotonic(), engine.version))
            return result

        engine.generate = generate
    return gate


def close_transports(job: Any) -> None:
    """Close every transport of an in-process job (a Mooncake master, a store socket)."""
    p = job.pipeline
    for handle in [*p.proxy.workers.values(), *p.trainers]:
        transport = getattr(getattr(handle, "target", None), "transport", None)
        if transport is not None:
            transport.close()


def run_gated(tmp_path: Any, transport: str, options: dict[str, Any] | None = None,
              steps: int = 5, alpha: int = 1, data: dict[str, Any] | None = None,
              overrides: list[str] | None = None, gate_timeout_s: float = 120.0,
              ) -> tuple[Any, list[Any], Gate]:
    """One small in-process training run with gated transfers; returns (job, records, gate)."""
    from rollart_sdk.config import load_config
    from rollart_sdk.job import build_job, run_job

    # Deferral on (not "auto", which waits for a transfer as fast as the ungated ones):
    # these runs check what a deferred update does.
    extra = [f"output_dir={tmp_path}", f"transport.name={transport}",
             f"rollout.alpha={alpha}", f"train.steps={steps}",
             "rollout.defer_weight_update=true"]
    extra += [f"transport.options.{k}={v}" for k, v in (options or {}).items()]
    cfg, lines = load_config(data=copy.deepcopy(data or SMALL_RUN),
                             overrides=[*extra, *(overrides or [])])
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    gate = gate_job(job, timeout_s=gate_timeout_s)
    try:
        records = run_job(job, steps, progress=False)
    finally:
        gate.closed.set()
        close_transports(job)
        job.close()
    return job, records, gate


def check_deferred(job: Any, records: list[Any], gate: Gate) -> dict[int, int]:
    """The assertions of the module docstring; returns version -> requests completed on
    the old version while it arrived (the smallest over the engines)."""
    p = job.pipeline
    log = p.log
    alpha = p.alpha
    engines = sorted(p.proxy.workers)
    committed = [int(e.split(":")[1]) for e in log if e.startswith("update:")]
    assert committed == sorted(committed) and len(set(committed)) == len(committed), log
    later = [v for v in committed if v >= gate.first]
    assert later, f"no version >= {gate.first} was committed: {log}"
    overlapped: dict[int, int] = {}
    for v in later:
        # Deferred at one suspend point, swapped in at a later one.
        assert log.index(f"defer:{v}") < log.index(f"update:{v}"), log
        windows = gate.windows.get(v, {})
        assert sorted(windows) == engines, (v, windows)
        for name, (opened, _, ended) in windows.items():
            # Nothing suspended the engines while v arrived.
            assert "suspend" not in log[opened:ended], (v, name, log[opened:ended])
        overlapped[v] = min(g for _, g, _ in windows.values())
    # ... and they served requests meanwhile, on the version they had.
    assert sum(overlapped.values()) >= 1, (overlapped, gate.windows)
    for rec in records:
        floor = max(rec.step - 1, 0) - alpha
        for t in rec.batch:
            assert t.start_version >= floor, (rec.step, t.start_version, floor)
            assert rec.version - t.start_version <= alpha + 1
            for turn in t.turns:
                assert all(t.start_version <= v <= rec.version for v in turn.versions)
    assert p.scheduler.launched == p.buffer.trained + sum(p.buffer.dropped.values())
    return overlapped
