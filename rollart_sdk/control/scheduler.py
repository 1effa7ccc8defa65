"""RolloutScheduler: keeps environments running across tasks by their sampling weights.

It launches trajectories in GRPO groups (``group_size`` trajectories sharing an env seed),
each driven by its own EnvManager task, and puts every finished trajectory into the
SampleBuffer. How many may run is set by the pipeline:

- continuous (``async``): up to ``max_running`` at once, under admission control
  (AReaL's rule): a task starts a group only while the trajectories it launched and has not
  lost stay within ``(version + alpha + 2) * share``, ``version`` being the one the engines
  serve and ``share`` its trajectories per batch. Every trajectory started at version ``v``
  is then one that batches up to the last one formed while the engines serve ``v + alpha``
  can take, if trajectories finish about in launch order: staleness is bounded by not
  starting work that could not be consumed, not by aborting it later;
- quota (``sync`` / ``one_off``): exactly ``allow(n)`` more trajectories, then wait. With
  ``interaction="batched"`` the trajectories of one allowance step in lockstep
  (:class:`~rollart_sdk.control.lockstep.TurnBarrier`).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from rollart_sdk.control.buffer import SampleBuffer
from rollart_sdk.control.chat import ChatFormat
from rollart_sdk.control.env_manager import EnvManager, TaskRuntime
from rollart_sdk.control.env_pool import EnvPool, EnvSlot, close_instance
from rollart_sdk.control.handles import WorkerHandle
from rollart_sdk.control.lockstep import TurnBarrier
from rollart_sdk.control.proxy import LLMProxy
from rollart_sdk.types import Trajectory


class RolloutScheduler:
    def __init__(
        self,
        tasks: dict[str, TaskRuntime],
        chat: ChatFormat,
        proxy: LLMProxy,
        env_workers: list[WorkerHandle],
        reward_worker: WorkerHandle,
        buffer: SampleBuffer,
        version: Callable[[], int],
        group_size: int,
        max_running: int,
        alpha: int | None = None,
        batch_quota: dict[str, int] | None = None,
        seed: int = 0,
        event_sink: Callable[[dict[str, Any]], None] | None = None,
        interaction: str = "trajectory",
        env_pools: dict[str, int] | None = None,
    ) -> None:
        if max_running < group_size:
            raise ValueError(f"max_running ({max_running}) must hold a group ({group_size})")
        self.tasks = tasks
        self.chat = chat
        self.proxy = proxy
        self.env_workers = env_workers
        self.reward_worker = reward_worker
        self.buffer = buffer
        self.version = version
        self.group_size = group_size
        self.max_running = max_running
        # Admission control (continuous mode): bound alpha and each task's trajectories
        # per batch; None: only max_running limits launches.
        self.alpha = alpha
        self.batch_quota = batch_quota
        if alpha is not None and batch_quota is None:
            raise ValueError("admission control (alpha) needs batch_quota: trajectories per batch per task")
        self.interaction = interaction
        self._wave: TurnBarrier | None = None
        self.seed = seed
        self._rng = random.Random(seed)  # task choice by weight
        self._emit = event_sink
        self._tags = list(tasks)
        self._weights = [tasks[t].config.weight for t in self._tags]
        self.running: dict[str, tuple[EnvManager, asyncio.Task[Trajectory]]] = {}
        self._quota: dict[str, int] | None = None  # per-task launches left; None: continuous
        self._wakeup = asyncio.Event()
        self._stopped = False
        self._loop_task: asyncio.Task[None] | None = None
        buffer.on_room.append(self._wakeup.set)
        self._group_counter = 0
        self._traj_counter = 0
        self._env_rr = 0
        self.launched = 0
        self.launched_by_tag: Counter[str] = Counter()
        # Pooled environments (the paper's EnvManagers living across episodes), per task;
        # a task without a pool gets one environment per trajectory.
        self.pools: dict[str, EnvPool] = {}
        for i, (tag, size) in enumerate(sorted((env_pools or {}).items())):
            if size < group_size:
                raise ValueError(f"task {tag!r}: env_pool {size} cannot hold a group of {group_size}")
            self.pools[tag] = EnvPool.spread(tag, size, env_workers, offset=i)
        self._slot_of: dict[str, EnvSlot] = {}  # trajectory id -> its pooled environment

    # ------------------------------------------------------------------ control
    def start(self, quota: dict[str, int] | None = None) -> None:
        self._quota = dict(quota) if quota is not None else None
        self._new_wave()
        self._loop_task = asyncio.create_task(self._loop(), name="rollout-scheduler")

    def allow(self, per_task: dict[str, int]) -> None:
        """Quota mode: allow more launches, per task tag (trajectories, whole groups)."""
        quota = self._quota or {}
        for tag, n in per_task.items():
            quota[tag] = quota.get(tag, 0) + n
        self._quota = quota
        self._new_wave()
        self._wakeup.set()

    def _new_wave(self) -> None:
        """Batched interaction: the launches of one allowance step in lockstep."""
        if self.interaction == "batched":
            self._wave = TurnBarrier()

    def wake(self) -> None:
        """Re-check what may launch (the pipeline calls it after a weight update)."""
        self._wakeup.set()

    def admission_room(self, tag: str) -> int | None:
        """Trajectories ``tag`` may still start under admission control (None: no rule)."""
        if self.alpha is None or self.batch_quota is None:
            return None
        live = self.launched_by_tag[tag] - self.buffer.dropped_by_tag[tag]
        return (self.version() + self.alpha + 2) * self.batch_quota[tag] - live

    async def abort_where(self, predicate: Callable[[Trajectory], bool], reason: str) -> int:
        """ABORT running trajectories matching ``predicate`` (in the engine too)."""
        victims = [m for m, _ in self.running.values() if predicate(m.traj) and not m.aborted]
        return sum(await asyncio.gather(*(m.abort(reason) for m in victims)))

    async def abort_all(self, reason: str) -> int:
        if self._quota is not None:
            self._quota = {}
        return await self.abort_where(lambda t: True, reason)

    async def stop(self, reason: str = "shutdown", timeout: float = 60.0) -> None:
        self._stopped = True
        self._wakeup.set()
        await self.abort_all(reason)
        tasks = [t for _, t in self.running.values()]
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=timeout)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
        await self.close_envs()

    async def close_envs(self) -> None:
        """Close every pooled environment instance (run end)."""
        built = [s for p in self.pools.values() for s in p.slots if s.built or s.manager]
        errors = await asyncio.gather(*(close_instance(s.worker, s.env_id) for s in built))
        for slot, err in zip(built, errors, strict=True):
            slot.built = False
            if err and self._emit is not None:
                self._emit({"trajectory": None, "tag": slot.tag, "span": "env_close_failed",
                            "worker": slot.worker.name, "error": err})

    def env_metrics(self) -> dict[str, float]:
        """``env/reset_s/<tag>`` (mean reset time since the last call), ``env/failures/<tag>``
        (instances failed and replaced so far), pool sizes and episodes."""
        out: dict[str, float] = {}
        for pool in self.pools.values():
            out.update(pool.metrics())
        if self.pools:
            out["env/failures"] = float(sum(p.failures for p in self.pools.values()))
        return out

    # ------------------------------------------------------------------ loop
    def _launchable_tags(self) -> list[str]:
        """Tasks that may start a group now (all, or none, outside the async bound)."""
        if self._stopped or len(self.running) + self.group_size > self.max_running:
            return []
        tags = [t for t in self._tags if t not in self.pools or self.pools[t].free() >= self.group_size]
        if self._quota is not None:
            return [t for t in tags if self._quota.get(t, 0) >= self.group_size]
        if self.alpha is None:
            return tags
        # Per task, so that a task whose trajectories finish fast cannot take the others'
        # room. Outstanding work (running + buffered) stays O((alpha + 1) * batch).
        return [t for t in tags if (self.admission_room(t) or 0) >= self.group_size]

    async def _loop(self) -> None:
        while not self._stopped:
            while tags := self._launchable_tags():
                self._launch_group(tags)
            self._wakeup.clear()
            await self._wakeup.wait()

    def _launch_group(self, tags: list[str]) -> None:
        weights = [self.tasks[t].config.weight for t in tags]
        tag = self._rng.choices(tags, weights=weights, k=1)[0]
        self._group_counter += 1
        group_id = f"g{self._group_counter}"
        # Seeds keyed by the launch index, not by this RNG's call sequence: group k gets
        # the same env (and e.g. the same latency draws) whatever the mode launched before.
        env_seed = _keyed_seed(self.seed, "env", self._group_counter)
        version = self.version()
        if self._quota is not None:
            self._quota[tag] -= self.group_size
        for _ in range(self.group_size):
            self._traj_counter += 1
            tid = f"{tag}-{group_id}-{self._traj_counter}"
            traj = Trajectory(trajectory_id=tid, tag=tag, group_id=group_id, start_version=version)
            sample_seed = _keyed_seed(self.seed, "sample", self._traj_counter)
            mgr = self._manager(traj, env_seed, sample_seed)
            task = asyncio.create_task(self._run(mgr), name=f"traj-{tid}")
            self.running[tid] = (mgr, task)
            self.launched += 1
            self.launched_by_tag[tag] += 1

    def _manager(self, traj: Trajectory, env_seed: int, sample_seed: int) -> EnvManager:
        """The EnvManager for a new trajectory: its pooled environment's own (made once,
        reused episode after episode), or a fresh one for an unpooled task."""
        pool = self.pools.get(traj.tag)
        if pool is None:
            return EnvManager(traj, env_seed, sample_seed, self.tasks[traj.tag], self.chat,
                              self.proxy, self._pick_env_worker(), self.reward_worker,
                              self.version, self._emit, barrier=self._wave)
        slot = pool.acquire()
        self._slot_of[traj.trajectory_id] = slot
        if slot.manager is None:
            slot.manager = EnvManager(traj, env_seed, sample_seed, self.tasks[traj.tag], self.chat,
                                      self.proxy, slot.worker, self.reward_worker, self.version,
                                      self._emit, barrier=self._wave, env_id=slot.env_id)
        else:
            slot.manager.next_episode(traj, env_seed, sample_seed, barrier=self._wave,
                                      env_id=slot.env_id)
        return slot.manager

    async def _return_slot(self, traj: Trajectory) -> None:
        """Give the trajectory's pooled environment back; close and replace it if it failed."""
        slot = self._slot_of.pop(traj.trajectory_id, None)
        if slot is None:
            return
        resets = [t1 - t0 for span, t0, t1 in traj.timings if span == "env_reset"]
        old_id = slot.env_id
        # Only a reset that returned built the instance (a failed one may not have).
        ok_reset = resets[0] if resets and not (traj.dropped or "").startswith("env_reset") else None
        if self.pools[traj.tag].release(slot, traj.dropped, ok_reset):
            err = await close_instance(slot.worker, old_id)
            if self._emit is not None:
                self._emit({"trajectory": traj.trajectory_id, "tag": traj.tag,
                            "span": "env_replaced", "worker": slot.worker.name,
                            "reason": traj.dropped, "close_error": err})

    def _pick_env_worker(self) -> WorkerHandle:
        self._env_rr = (self._env_rr + 1) % len(self.env_workers)
        return self.env_workers[self._env_rr]

    async def _run(self, mgr: EnvManager) -> Trajectory:
        traj = mgr.traj
        try:
            await mgr.run()
        except asyncio.CancelledError:
            traj.dropped = traj.dropped or "aborted:cancelled"
        except Exception as exc:  # noqa: BLE001 - a bug in one trajectory stalls no other
            traj.dropped = f"internal_error: {type(exc).__name__}: {exc}"
        finally:
            self.running.pop(traj.trajectory_id, None)
            await self._return_slot(traj)
            await self.buffer.put(traj)
            self._wakeup.set()
        return traj


def _keyed_seed(seed: int, kind: str, index: int) -> int:
    """A seed determined by (run seed, kind, launch index) alone."""
    return random.Random(f"{seed}/{kind}/{index}").randrange(2**31)
