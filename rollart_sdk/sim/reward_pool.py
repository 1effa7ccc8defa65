"""Paper R3 on simulated time: reward capacity reserved per job vs shared and serverless.

``rollart sim --experiment reward`` runs several simulated jobs at once on one virtual
clock (the real control plane of each, the sim engine/trainer/env backends) whose
rewards are served by a :class:`RewardPool`:

- ``reserved`` (per job): ``instances`` reward devices held from the job's start to its
  end, whatever the load - the paper's reward GPUs reserved beside each job;
- ``serverless`` (shared by every job): instances start on demand (each start takes
  ``cold_s`` before it serves: a cold start), serve calls of any job, and an instance idle
  for ``keep_warm_s`` is reclaimed (scale to zero); at most ``max_instances``.

An instance serves up to ``concurrency`` calls at once (a judge batches); a call takes
``service_s`` (drawn, seeded). A call that finds every instance full waits for a slot;
serverless, it also starts another instance (below the maximum) when the calls in flight
and waiting exceed ``target_ongoing`` per instance - Ray Serve's autoscaling rule. Utilisation is busy
time (at least one call in flight) over reserved time (created -> reclaimed or the end),
summed over instances: the same definition as ``rollart bench reward``.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rollart_sdk.sim.costs import Dist
from rollart_sdk.types import RewardRequest, RewardResult


@dataclass
class _Instance:
    created: float
    ready: float
    inflight: int = 0
    busy_s: float = 0.0
    busy_since: float = 0.0
    idle_since: float = 0.0
    draining: bool = False  # the autoscaler removes it once its calls finish
    ended: float | None = None  # reclaimed (serverless) or released (reserved)


@dataclass(eq=False)
class RewardPool:
    """Reward instances on the running loop's (virtual) clock; see the module doc."""

    service_s: Dist
    mode: str = "serverless"  # or "reserved"
    instances: int = 1  # reserved: held from open() to close()
    max_instances: int = 64  # serverless
    concurrency: int = 1
    target_ongoing: float = 8.0  # serverless: calls per instance the autoscaler aims at
    cold_s: float = 10.0
    upscale_delay_s: float = 2.0
    downscale_delay_s: float = 30.0
    keep_warm_s: float = 60.0  # idle seconds before the last instance goes (to zero)
    look_back_s: float = 10.0
    seed: int = 0
    pool: list[_Instance] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    cold_starts: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("serverless", "reserved"):
            raise ValueError(f"RewardPool mode {self.mode!r}: 'serverless' or 'reserved'")
        self._rng = random.Random(self.seed)
        self._waiting: deque[asyncio.Future[_Instance]] = deque()
        self._samples: deque[tuple[float, int]] = deque()
        self._want_since: tuple[int, float] | None = None  # (direction, since)
        self._controller: asyncio.Task[None] | None = None

    def open(self, now: float) -> None:
        """A reserved pool takes its instances now (the job starts); a serverless pool
        starts its autoscaler (with no instance: it scales from zero)."""
        if self.mode == "reserved":
            self.pool = [_Instance(now, now, idle_since=now) for _ in range(self.instances)]
        else:
            self._controller = asyncio.get_running_loop().create_task(self._autoscale())

    def close(self, now: float) -> None:
        """The end: a reserved pool releases its instances now; a serverless instance
        still up goes once idle for its delay (nothing calls any more): the last one after
        keep_warm_s (to zero), the others after downscale_delay_s."""
        if self._controller is not None:
            self._controller.cancel()
            self._controller = None
        live = sorted(self._live(), key=lambda i: i.idle_since)
        for n, inst in enumerate(live):
            if self.mode == "reserved":
                inst.ended = now
            else:
                delay = self.keep_warm_s if n == len(live) - 1 else self.downscale_delay_s
                inst.ended = max(now, inst.idle_since + delay)

    async def score(self, request: RewardRequest) -> RewardResult:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        inst = await self._acquire(loop)
        try:
            await asyncio.sleep(self.service_s.draw(self._rng))
        finally:
            self._release(inst, loop.time())
        self.latencies.append(loop.time() - t0)
        return RewardResult(request.trajectory_id, float(request.env_return),
                            {"latency_s": loop.time() - t0})

    # ------------------------------------------------------------------ routing
    def _live(self) -> list[_Instance]:
        return [i for i in self.pool if i.ended is None]

    async def _acquire(self, loop: asyncio.AbstractEventLoop) -> _Instance:
        now = loop.time()
        free = [i for i in self._live() if i.ready <= now and not i.draining
                and i.inflight < self.concurrency]
        if free and not self._waiting:
            inst = min(free, key=lambda i: i.inflight)  # the least loaded, as Serve routes
            self._begin(inst, now)
            return inst
        waiter: asyncio.Future[_Instance] = loop.create_future()
        self._waiting.append(waiter)
        return await waiter

    def _begin(self, inst: _Instance, now: float) -> None:
        if inst.inflight == 0:
            inst.busy_since = now
        inst.inflight += 1

    def _release(self, inst: _Instance, now: float) -> None:
        inst.inflight -= 1
        if inst.inflight == 0:
            inst.busy_s += now - inst.busy_since
            inst.idle_since = now
            if inst.draining:
                inst.ended = now
                return
        self._hand_over(inst, now)

    def _hand_over(self, inst: _Instance, now: float | None) -> None:
        """Waiting calls take ``inst``'s free slots (``now`` None: the loop's time)."""
        if now is None:
            now = asyncio.get_running_loop().time()
        if inst.ended is not None or inst.draining:
            return
        while self._waiting and inst.inflight < self.concurrency:
            waiter = self._waiting.popleft()
            if not waiter.done():
                self._begin(inst, now)
                waiter.set_result(inst)

    # ------------------------------------------------------------------ autoscaler
    async def _autoscale(self, every_s: float = 1.0) -> None:
        """Ray Serve's policy, simplified: desired = ceil(mean calls in flight and waiting
        over look_back_s / target_ongoing); up after upscale_delay_s of wanting more, down
        after downscale_delay_s of wanting fewer (to zero: keep_warm_s with no call)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every_s)
            now = loop.time()
            live = [i for i in self._live() if not i.draining]
            ongoing = sum(i.inflight for i in live) + len(self._waiting)
            self._samples.append((now, ongoing))
            while self._samples and self._samples[0][0] < now - self.look_back_s:
                self._samples.popleft()
            mean = sum(n for _, n in self._samples) / len(self._samples)
            desired = min(self.max_instances, math.ceil(mean / self.target_ongoing))
            if ongoing and not live:
                desired = max(desired, 1)  # from zero: the first call starts one at once
            if desired == len(live):
                self._want_since = None
                continue
            direction = 1 if desired > len(live) else -1
            if self._want_since is None or self._want_since[0] != direction:
                self._want_since = (direction, now)
            delay = (0.0 if not live else self.upscale_delay_s) if direction > 0 else \
                (self.keep_warm_s if desired == 0 else self.downscale_delay_s)
            if now - self._want_since[1] < delay:
                continue
            self._want_since = None
            if direction > 0:
                for _ in range(desired - len(live)):
                    self._start(loop, now)
            else:
                for inst in sorted(live, key=lambda i: i.inflight)[: len(live) - desired]:
                    inst.draining = True
                    if inst.inflight == 0:
                        inst.ended = now

    def _start(self, loop: asyncio.AbstractEventLoop, now: float) -> None:
        self.cold_starts += 1
        inst = _Instance(now, now + self.cold_s, idle_since=now + self.cold_s)
        self.pool.append(inst)
        loop.call_later(self.cold_s, self._hand_over, inst, None)

    # ------------------------------------------------------------------ figures
    def usage(self) -> dict[str, Any]:
        busy = sum(i.busy_s for i in self.pool)
        reserved = sum((i.ended or i.created) - i.created for i in self.pool)
        return {"busy_s": busy, "reserved_s": reserved, "instances": len(self.pool),
                "cold_starts": self.cold_starts,
                "utilisation": busy / reserved if reserved else None}


# ----------------------------------------------------------------------------- experiment
# The reward model on one device: a forward pass over the trajectory, N(0.3 s, 0.1 s),
# up to 8 calls batched at once; a job's dedicated reward capacity is one 8-device node.
# The serverless deployment: a 30 s cold start, Ray Serve's rule aiming at 8 calls per
# instance over a 30 s look-back (up after 30 s and look-back as Ray Serve's defaults;
# down after 60 s, to zero after 60 s idle, where Ray's default would wait 600 s).
JUDGE_S = {"kind": "normal", "mean": 0.3, "std": 0.1, "min": 0.05}
RESERVED_PER_JOB = 8
CONCURRENCY = 8
SERVERLESS = {"cold_s": 30.0, "target_ongoing": 8.0, "upscale_delay_s": 30.0,
              "look_back_s": 30.0, "downscale_delay_s": 60.0, "keep_warm_s": 60.0}
STAGGER_S = 120.0  # jobs start at seeded uniform times in [0, STAGGER_S] (the first at 0)


def run_jobs(datas: list[dict[str, Any]], steps: int, pools: list[RewardPool],
             out_dir: str, starts: list[float] | None = None) -> list[dict[str, Any]]:
    """Build one simulated job per config, give job i's reward tasks ``pools[i]`` (the
    same pool object for a shared deployment), run them together on one virtual clock,
    job i starting at ``starts[i]`` virtual seconds; per job,
    :func:`rollart_sdk.control.metrics.reward_exposure` of its steps."""
    import copy

    from rollart_sdk.config import load_config
    from rollart_sdk.control.metrics import reward_exposure
    from rollart_sdk.sim.clock import run_virtual
    from rollart_sdk.sim.job import build_sim_job

    jobs = []
    for i, data in enumerate(datas):
        data = copy.deepcopy(data)
        data["output_dir"] = f"{out_dir}/job{i}"
        cfg, _ = load_config(data=data)
        job = build_sim_job(cfg, log=lambda *a, **k: None)
        for tag in job.reward.local_tags:
            job.reward.set_backend(tag, pools[i])
        jobs.append(job)

    starts = starts or [0.0] * len(jobs)
    own = [sum(p is pool for p in pools) == 1 for pool in pools]  # a job's own pool

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for i, pool in enumerate(pools):
            if not own[i] and i == pools.index(pool):
                pool.open(loop.time())  # a shared pool: open from the first job's start

        async def one(i: int) -> None:
            await asyncio.sleep(starts[i])
            if own[i]:
                pools[i].open(loop.time())  # reserved when its job starts ...
            await jobs[i].pipeline.run(steps)
            if own[i]:
                pools[i].close(loop.time())  # ... released when it ends

        await asyncio.gather(*(one(i) for i in range(len(jobs))))
        for pool in pools:
            pool.close(asyncio.get_running_loop().time())

    run_virtual(main())
    results = []
    for job in jobs:
        p = job.pipeline
        results.append(reward_exposure(p.records, p.started))
        job.run_dir.close()
    return results
