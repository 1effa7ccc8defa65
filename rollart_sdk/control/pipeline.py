"""The asynchronous training protocol (paper section 6.3), one place to read it.

Every iteration:

1. get_batch  - block until the SampleBuffer holds ``batch_size`` trajectories in whole
                groups, evicting groups started before ``version - alpha``;
2. suspend    - the LLMProxy stops admitting requests; in-flight trajectories are kept;
3. update     - every engine worker swaps in the newest weights, which it has been
                receiving in the background since the trainer published them;
4. resume     - the LLMProxy admits requests again;
5. recompute  - inside the engines' swap: in-flight requests get their KV cache rebuilt
                under the new weights and continue (not restart);
6. train_step - on the batch from step 1, overlapping the resumed rollout; when it ends
                the trainer publishes the new version and engines start receiving it.

``mode`` turns the same loop into the paper's baselines:

- ``sync``: a quota of ``batch_size * (1 + redundancy)`` launches per iteration, surplus
  aborted once the batch is full, training and the update finish before the next launch:
  every trained token comes from the version being trained (on-policy);
- ``one_off``: the next iteration's quota launches right after the update, so rollout of
  batch k+1 overlaps training on batch k (staleness exactly 1);
- ``async``: environments run continuously; staleness bounded by ``alpha``. After an
  update, running trajectories that could only ever land in a batch beyond the bound are
  aborted at once (in the engine too), not left running.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollart_sdk.config import RunConfig
from rollart_sdk.control.buffer import SampleBuffer
from rollart_sdk.control.handles import WorkerHandle
from rollart_sdk.control.proxy import LLMProxy
from rollart_sdk.control.scheduler import RolloutScheduler
from rollart_sdk.types import TrainSample, Trajectory, WeightUpdateReport


@dataclass
class StepRecord:
    """What one iteration did, for metrics and tests."""

    step: int
    version: int  # trainer version the batch was trained at
    batch: list[Trajectory]
    get_batch_wait_s: float
    train_s: float = 0.0
    weight_sync_exposed_s: float = 0.0
    weight_transfer_s: float = 0.0
    recomputed: int = 0  # in-flight requests whose KV cache the update rebuilt
    train_metrics: dict[str, float] = field(default_factory=dict)
    aborted_stale: int = 0
    aborted_surplus: int = 0
    trained_total: int = 0  # trajectories trained on, this step included


class Pipeline:
    def __init__(
        self,
        config: RunConfig,
        proxy: LLMProxy,
        scheduler: RolloutScheduler,
        buffer: SampleBuffer,
        trainers: list[WorkerHandle],
        on_step: Callable[[StepRecord, dict[str, Any]], None] | None = None,
        protocol_log: list[str] | None = None,
        checkpoint_dir: str | None = None,
        event_sink: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = config
        self.proxy = proxy
        self.scheduler = scheduler
        self.buffer = buffer
        self.trainers = trainers
        self.on_step = on_step
        self.log = protocol_log if protocol_log is not None else []
        self.checkpoint_dir = checkpoint_dir
        self._emit = event_sink or (lambda e: None)
        self.engine_version = 0  # version every engine serves
        self.trainer_version = 0  # version the trainer holds (= train steps done)
        self._published: int | None = None  # newest version published, not yet loaded
        self.records: list[StepRecord] = []
        self.started = time.time()
        self.update_reports: list[WeightUpdateReport] = []
        r = config.rollout
        self.alpha = r.effective_alpha
        self.quota = task_quota(config)
        self.launch_per_step = launches_per_step(config)

    # ------------------------------------------------------------------ protocol pieces
    async def _train(self, step: int, batch: list[Trajectory]) -> StepRecord:
        from rollart_sdk.algorithms import fill_advantages

        rec = self.records[step]
        samples: list[TrainSample] = [t.to_sample() for t in batch]
        fill_advantages(samples)
        shards = [samples[i :: len(self.trainers)] for i in range(len(self.trainers))]
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(w.call("train_step", shard) for w, shard in zip(self.trainers, shards, strict=True))
        )
        rec.train_s = time.perf_counter() - t0
        self._span("train", self.trainers[0].name, t0, step)
        rec.train_metrics = dict(results[0])
        self.trainer_version += 1
        t1 = time.perf_counter()
        manifest = await self.trainers[0].call(
            "publish_weights", int(self.cfg.train.bucket_mb * 2**20)
        )
        self.log.append(f"publish:{manifest.version}")
        await self.proxy.broadcast("stage_weights", manifest)
        self._span("publish", self.trainers[0].name, t1, step)
        self._published = manifest.version
        every = self.cfg.train.checkpoint_every
        if self.checkpoint_dir and every and (step + 1) % every == 0:
            await self.trainers[0].call("save_checkpoint", f"{self.checkpoint_dir}/step-{step + 1}")
        return rec

    def _span(self, span: str, worker: str, t0_perf: float, step: int) -> None:
        """Timeline event for a pipeline stage (``t0_perf`` from perf_counter)."""
        now_wall, now_perf = time.time(), time.perf_counter()
        self._emit({"trajectory": None, "tag": None, "span": span, "worker": worker,
                    "step": step, "t0": now_wall - (now_perf - t0_perf), "t1": now_wall})

    async def _update_weights(self, rec: StepRecord | None) -> None:
        """Protocol steps 2-5: suspend, swap the staged version into every engine, resume."""
        if self._published is None or self._published == self.engine_version:
            return
        self.log.append("suspend")
        t0 = time.perf_counter()
        await self.proxy.suspend()
        try:
            self.log.append(f"update:{self._published}")
            reports: list[WeightUpdateReport] = await self.proxy.broadcast("commit_weights")
        finally:
            await self.proxy.resume()
            self.log.append("resume")
        self.engine_version = self._published
        self.update_reports.extend(reports)
        for w in self.proxy.workers.values():
            self._span("weight_sync", w.name, t0, self.trainer_version)
        if rec is not None:
            rec.weight_sync_exposed_s = max(r.exposed_s for r in reports)
            rec.weight_transfer_s = max(r.transfer_s for r in reports)
            rec.recomputed = sum(r.recomputed_requests for r in reports)

    # ------------------------------------------------------------------ the loop
    async def run(self, steps: int) -> list[StepRecord]:
        mode = self.cfg.rollout.mode
        batch_size = self.cfg.rollout.batch_size
        self.started = time.time()
        self.scheduler.start(quota=self.launch_per_step if mode != "async" else None)
        pending: asyncio.Task[StepRecord] | None = None
        try:
            for step in range(steps):
                if mode == "sync" and step > 0:
                    self.scheduler.allow(self.launch_per_step)
                self.log.append(f"get_batch:{step}")
                t0 = time.perf_counter()
                # The batch is trained at trainer version `step`: bound its staleness.
                batch = await self.buffer.get_batch(
                    batch_size, min_version=step - self.alpha, quota=self.quota
                )
                rec = StepRecord(step, step, batch, time.perf_counter() - t0,
                                 trained_total=self.buffer.trained)
                self.records.append(rec)
                if mode == "async" and self.engine_version < step + 1 - self.alpha:
                    # Launches now would start at a version the coming update makes too old
                    # for any batch: hold them until the new weights are in.
                    self.scheduler.hold(True)
                if mode != "async":
                    # The batch is full: the rest of this iteration's launches is surplus.
                    self.buffer.discard_all("surplus")
                    rec.aborted_surplus = await self.scheduler.abort_all("surplus")
                if pending is not None:
                    prev = await pending
                    self._report(prev)
                    pending = None
                await self._update_weights(rec)
                if mode == "async":
                    # Started before `step + 1 - alpha`: could only enter a batch past the
                    # bound, so abort now (the engine frees its slot) instead of evicting later.
                    floor = step + 1 - self.alpha
                    rec.aborted_stale = await self.scheduler.abort_where(
                        lambda t, floor=floor: t.start_version < floor, "stale"
                    )
                    self.scheduler.hold(False)
                elif mode == "one_off" and step + 1 < steps:
                    self.scheduler.allow(self.launch_per_step)
                self.log.append(f"train_step:{step}")
                pending = asyncio.create_task(self._train(step, batch))
                if mode == "sync":
                    done = await pending
                    pending = None
                    await self._update_weights(done)
                    self._report(done)
            if pending is not None:
                self._report(await pending)
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
            await self.scheduler.stop("run_end")
            self.buffer.discard_all("run_end")
        return self.records

    # ------------------------------------------------------------------ metrics
    def _report(self, rec: StepRecord) -> None:
        metrics = step_metrics(rec, self.buffer, time.time() - self.started, self.proxy)
        if self.on_step is not None:
            self.on_step(rec, metrics)


def task_quota(config: RunConfig) -> dict[str, int]:
    """Trajectories of each task in a batch: whole groups, by sampling weight (largest
    remainder). Every task gets at least one group."""
    r = config.rollout
    groups = r.batch_size // r.group_size
    tasks = config.tasks
    if groups < len(tasks):
        raise ValueError(
            f"rollout.batch_size {r.batch_size} holds {groups} group(s) of {r.group_size}, "
            f"fewer than the {len(tasks)} tasks; raise batch_size to at least "
            f"{len(tasks) * r.group_size}"
        )
    total = sum(t.weight for t in tasks)
    exact = {t.tag: 1 + (groups - len(tasks)) * t.weight / total for t in tasks}
    alloc = {tag: int(x) for tag, x in exact.items()}
    left = groups - sum(alloc.values())
    for tag in sorted(exact, key=lambda k: exact[k] - alloc[k], reverse=True)[:left]:
        alloc[tag] += 1
    return {tag: n * r.group_size for tag, n in alloc.items()}


def launches_per_step(config: RunConfig) -> dict[str, int]:
    """Trajectories launched per iteration in sync / one_off (and the environments async
    keeps busy): each task's share of a batch plus ``redundancy``, in whole groups."""
    r = config.rollout
    return {
        tag: math.ceil(n * (1 + r.redundancy) / r.group_size) * r.group_size
        for tag, n in task_quota(config).items()
    }


def step_metrics(rec: StepRecord, buffer: SampleBuffer, wall: float, proxy: LLMProxy) -> dict[str, Any]:
    by_tag: dict[str, list[Trajectory]] = {}
    for t in rec.batch:
        by_tag.setdefault(t.tag, []).append(t)
    staleness = [rec.version - t.start_version for t in rec.batch]
    m: dict[str, Any] = {
        "step": rec.step,
        "wall_time": round(wall, 3),
        "version": rec.version,
        "staleness/max": max(staleness),
        "staleness/mean": sum(staleness) / len(staleness),
        "staleness/hist": dict(sorted(Counter(staleness).items())),
        "trajectories/trained": rec.trained_total,
        "trajectories/dropped": sum(buffer.dropped.values()),
        "trajectories/aborted_stale": rec.aborted_stale,
        "trajectories/aborted_surplus": rec.aborted_surplus,
        "buffer/max_ready": buffer.max_ready_trajectories,
        "time/get_batch_wait": round(rec.get_batch_wait_s, 4),
        "time/train": round(rec.train_s, 4),
        "time/weight_sync": round(rec.weight_sync_exposed_s, 4),
        "time/weight_transfer": round(rec.weight_transfer_s, 4),
        "weight_sync/recomputed_requests": rec.recomputed,
    }
    for reason, n in sorted(buffer.dropped.items()):
        m[f"dropped/{reason}"] = n
    for tag, trajs in sorted(by_tag.items()):
        m[f"reward/{tag}"] = sum(t.reward or 0.0 for t in trajs) / len(trajs)
        succ = [t.info.get("success") for t in trajs if "success" in t.info]
        if succ:
            m[f"success/{tag}"] = sum(1.0 for s in succ if s) / len(succ)
        m[f"turns/{tag}"] = sum(len(t.turns) for t in trajs) / len(trajs)
        m[f"count/{tag}"] = len(trajs)
    for k, v in rec.train_metrics.items():
        m[k if "/" in k else f"train/{k}"] = v
    return m
