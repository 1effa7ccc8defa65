"""RolloutScheduler: keeps environments running across tasks by their sampling weights.

It launches trajectories in GRPO groups (``group_size`` trajectories sharing an env seed),
each driven by its own EnvManager task, and puts every finished trajectory into the
SampleBuffer. How many may run is set by the pipeline:

- continuous (``async``): up to ``max_running`` at once, under admission control
  (AReaL's rule, ``N <= (i + eta + 1) * B``): a task starts a group only while the
  trajectories it launched and has not lost stay within ``(base + max(alpha, 1) + 1) *
  share``, ``base`` being the engines' version, one more while a newer one is held back
  (``PolicyVersions.admission_base``), and ``share`` its trajectories per batch. Batch
  ``j`` is trained at trainer version ``j`` and the engines swap a finished step in at
  once (``Pipeline._next_batch``), so a trajectory started now lands, if trajectories
  finish about in launch order, in a batch trained at most ``max(alpha, 1)`` versions
  after the newest weights: the
  rollout runs no further ahead of the trainer than that. And never beyond what the
  engines' version ``v`` can feed, ``(v + alpha + 2) * share`` (batch ``k`` takes start
  versions ``>= k - 1 - alpha``): while a deferred update keeps the engines a version
  behind, a trajectory started for a later batch would only be dropped as stale.
  Staleness is bounded by not starting work that could not be consumed, not by aborting
  it later;
- quota (``sync`` / ``one_off``): exactly ``allow(n)`` more trajectories, then wait. With
  ``interaction="batched"`` the trajectories of one allowance step in lockstep
  (:class:`~rollart_sdk.control.lockstep.TurnBarrier`).

Failures (docs/failures.md): a member dropped by a failure (env, engine, reward) is re-run
in its group from the group's env seed, up to ``max_member_retries`` per group (a re-run
runs on its own timeline, outside a lockstep wave); a group dropped whole is replaced by
a new group in quota modes (admission control gives async the room back anyway). A task
whose trajectories keep failing backs off before its next launch (doubling, up to
``MAX_BACKOFF_S``). An exception escaping an EnvManager is a bug: it is kept in ``fatal``
and the pipeline stops the run with it, instead of retrying for ever.

What the parts below it say reaches it through the run's
:class:`~rollart_sdk.control.events.RolloutEvents` (given to it and to the buffer): its
launch loop awaits ``events.wakeup`` (room freed in the buffer, a new engine version) and
drains the groups the buffer dropped whole; every finished trajectory is written to
``events.finished``, whose readers (the watchdog, the run directory, the sample log) the
composition root fixed. Nothing below calls into the scheduler.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

from rollart_sdk.cluster.handles import WorkerHandle
from rollart_sdk.control.aio import wait_for
from rollart_sdk.control.buffer import SampleBuffer
from rollart_sdk.control.chat import ChatFormat
from rollart_sdk.control.env_manager import EnvManager, TaskRuntime
from rollart_sdk.control.env_pool import EnvPool, EnvSlot, close_instance
from rollart_sdk.control.events import RolloutEvents
from rollart_sdk.control.lockstep import StartGate, TurnBarrier
from rollart_sdk.control.proxy import LLMProxy
from rollart_sdk.types import Trajectory

MAX_BACKOFF_S = 2.0
# Failed trajectories in a row of one task at which the console says so (its launches
# then wait MAX_BACKOFF_S: 0.01 s doubled from the second failure on).
FAILING_IN_A_ROW = 8
# At stop, after the aborts: how long the episodes get to end by themselves (an aborted
# generate returns at once; an env step, a reward call run on) before they are cancelled.
# They are dropped either way (the run is ending), and one cancelled is counted as
# dropped at run end; an env call of minutes must not hold the stop, and the final
# checkpoint and summary after it. (A finished trajectory still landing, its env slot
# being returned, is also cancelled after it: counted dropped, not carried to a resume.)
STOP_GRACE_S = 5.0
# Drops that are decisions of the control plane, not failures: never re-run.
NOT_FAILURES = ("aborted:", "surplus", "run_end", "stale", "group_incomplete", "internal_error",
                "zero_variance")
# Failures not re-run: the request killed engines (re-running it would kill more).
NOT_RERUN = ("kills_engines",)


def is_failure(reason: str | None) -> bool:
    return reason is not None and not reason.startswith(NOT_FAILURES)


class RolloutScheduler:
    def __init__(
        self,
        tasks: dict[str, TaskRuntime],
        chat: ChatFormat,
        proxy: LLMProxy,
        env_workers: list[WorkerHandle] | dict[str, list[WorkerHandle]],
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
        max_member_retries: int = 3,
        admission_version: Callable[[], int] | None = None,
        events: RolloutEvents | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        if max_running < group_size:
            raise ValueError(f"max_running ({max_running}) must hold a group ({group_size})")
        self.tasks = tasks
        self.chat = chat
        self.proxy = proxy
        # Per task tag: the env hosts of that task (one task's envs may live inline,
        # another's on env workers); ``env_workers``: every distinct host.
        self.env_by_tag = (dict(env_workers) if isinstance(env_workers, dict)
                           else {t: list(env_workers) for t in tasks})
        self.env_workers = list({w.name: w for ws in self.env_by_tag.values()
                                 for w in ws}.values())
        self.reward_worker = reward_worker
        self.buffer = buffer
        # Shared with the buffer (and the weight updates): what wakes the launch loop, the
        # groups dropped whole, the finished-trajectory stream.
        if events is not None and events is not buffer.events:
            raise ValueError("the scheduler and its buffer must share one RolloutEvents: "
                             "pass the same object to both (job/wire.py does)")
        self.events = buffer.events
        self.version = version  # the engines' (stamped on each trajectory)
        # What admission control counts from (PolicyVersions.admission_base: the engines'
        # version, +1 while one is held back); default: version. Capped by what
        # ``version`` can still feed.
        self.admission_version = admission_version or version
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
        self._quota_closed = False
        self._gate: StartGate | None = None  # the current allowance's (launched ahead)
        self._wakeup = self.events.wakeup  # the launch loop awaits it
        self._stopped = False
        self._loop_task: asyncio.Task[None] | None = None
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
            self.pools[tag] = EnvPool.spread(tag, size, self.env_by_tag[tag], offset=i)
        self._slot_of: dict[str, EnvSlot] = {}  # trajectory id -> its pooled environment
        self.max_member_retries = max_member_retries
        self._groups: dict[str, tuple[str, int, int]] = {}  # group -> (tag, env seed, retries)
        self._fails: dict[str, int] = {}  # tag -> consecutive failed trajectories
        self._say = say or (lambda line: None)  # a line for the user (a task failing)
        self._said_failing: set[str] = set()
        self._not_before: dict[str, float] = {}  # tag -> monotonic time of its next launch
        self._delayed: set[asyncio.Task[None]] = set()  # re-runs waiting out a backoff
        self.retried = 0  # members re-run after a failure
        # Trajectories that left `running` and are not counted yet (their env slot is being
        # returned, e.g. a failed env closed and replaced, or the buffer's lock awaited):
        # still in flight for the step metrics' launched = trained + dropped + in flight,
        # and waited for by stop(). Trajectory id -> (the trajectory, its task).
        self.landing: dict[str, tuple[Trajectory, asyncio.Task[Any]]] = {}
        self.fatal: BaseException | None = None  # a bug in the control plane: ends the run
        self.fatal_traceback = ""
        self._abandoned: set[str] = set()  # counted by stop() while still running

    # ------------------------------------------------------------------ control
    def start(self, quota: dict[str, int] | None = None) -> None:
        self._quota = dict(quota) if quota is not None else None
        self._new_wave()
        self._loop_task = asyncio.create_task(self._loop(), name="rollout-scheduler")
        self._loop_task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """A launch loop that died of a bug ends the run (the pipeline's guard raises
        ``fatal``), rather than showing up later as a stall."""
        if not task.cancelled() and task.exception() is not None and self.fatal is None:
            exc = task.exception()
            self.fatal = exc
            self.fatal_traceback = "".join(traceback.format_exception(exc))

    def allow(self, per_task: dict[str, int], gate: StartGate | None = None) -> None:
        """Quota mode: allow more launches, per task tag (trajectories, whole groups).
        With ``gate``, they are launched ahead of their weights: each resets its
        environment, then waits at the gate before its first generation."""
        self._gate = gate
        quota = self._quota or {}
        self._quota_closed = False
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
        """Re-check what may launch (what the parts below write into ``events.room()``)."""
        self._wakeup.set()

    def admission_room(self, tag: str) -> int | None:
        """Trajectories ``tag`` may still start under admission control (None: no rule)."""
        if self.alpha is None or self.batch_quota is None:
            return None
        live = self.launched_by_tag[tag] - self.buffer.dropped_by_tag[tag]
        ahead = max(self.alpha, 1)  # alpha 0 (one_off-like) still overlaps one batch
        batches = self.admission_version() + ahead + 1
        # Never more than the engines' version can still feed: batch ``k`` takes start
        # versions >= k - 1 - alpha (Pipeline's batch floor), so a trajectory sampled now
        # on version ``v`` lands, in launch order, in a batch up to ``v + alpha + 1``. While
        # a deferred update keeps the engines on ``v`` and the trainer finishes the next
        # step, counting from the trainer alone started a batch that no batch could take
        # (37 % of the quickstart's trajectories dropped as stale, 5 Dec).
        batches = min(batches, self.version() + self.alpha + 2)
        return batches * self.batch_quota[tag] - live

    async def abort_where(self, predicate: Callable[[Trajectory], bool], reason: str) -> int:
        """ABORT running trajectories matching ``predicate`` (in the engine too)."""
        victims = [m for m, _ in self.running.values() if predicate(m.traj) and not m.aborted]
        return sum(await asyncio.gather(*(m.abort(reason) for m in victims)))

    async def abort_all(self, reason: str) -> int:
        if self._quota is not None:
            self._quota = {}
            self._quota_closed = True  # the batch is full: no replacements until allow()
        return await self.abort_where(lambda t: True, reason)

    async def stop(self, reason: str = "shutdown", timeout: float = 60.0,
                   grace: float = STOP_GRACE_S) -> None:
        """Abort every running trajectory (within ``timeout``), give them ``grace``
        seconds to end, then cancel the rest; each is counted once (dropped at run end)."""
        self._stopped = True
        self._wakeup.set()
        try:  # a stuck or failing engine must not keep the run from stopping
            await asyncio.wait_for(self.abort_all(reason), timeout)
        except Exception as exc:  # noqa: BLE001 - the tasks are cancelled below instead
            print(f"rollart: aborting the running trajectories at stop failed "
                  f"({type(exc).__name__}: {exc}); cancelling them", file=sys.stderr, flush=True)
        # Those landing (slot returned, then counted) too: each is counted once it returns.
        tasks = [t for _, t in [*self.running.values(), *self.landing.values()]]
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=grace)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
            self._count_unfinished()
        for delayed in list(self._delayed):
            delayed.cancel()
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
            except Exception:  # noqa: BLE001 - recorded as fatal by _loop_ended
                pass
        await self.close_envs()

    def _count_unfinished(self) -> None:
        """At stop, after the waits: a trajectory still not finished (e.g. an env close that
        outlasts them) is counted now, as dropped at run end, and not again should it
        finish later."""
        unfinished = [(tid, mgr.traj, task) for tid, (mgr, task) in self.running.items()]
        unfinished += [(tid, traj, task) for tid, (traj, task) in self.landing.items()]
        for traj_id, traj, task in unfinished:
            if not task.done() and traj_id not in self._abandoned:
                self._abandoned.add(traj_id)
                traj.dropped = "run_end: still running when the run stopped"
                self.buffer.count_drop(traj)

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
        now = time.monotonic()
        tags = [t for t in self._tags if self._not_before.get(t, 0.0) <= now  # backoff
                and (t not in self.pools or self.pools[t].free() >= self.group_size)]
        if self._quota is not None:
            return [t for t in tags if self._quota.get(t, 0) >= self.group_size]
        if self.alpha is None:
            return tags
        # Per task, so that a task whose trajectories finish fast cannot take the others'
        # room. Outstanding work (running + buffered) stays O((alpha + 1) * batch).
        return [t for t in tags if (self.admission_room(t) or 0) >= self.group_size]

    async def _loop(self) -> None:
        while not self._stopped:
            self._replace_dropped_groups()  # e.g. groups evicted as stale by get_batch
            while tags := self._launchable_tags():
                self._launch_group(tags)
            self._wakeup.clear()
            # A task backing off becomes launchable again by the clock, not by an event.
            now = time.monotonic()
            waits = [t - now for t in self._not_before.values() if t > now]
            try:
                await wait_for(self._wakeup.wait(), min(waits) if waits else None)
            except TimeoutError:
                pass

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
        self._groups[group_id] = (tag, env_seed, 0)
        for _ in range(self.group_size):
            self._launch_member(tag, group_id, env_seed, version, self._wave)

    def _launch_member(self, tag: str, group_id: str, env_seed: int, version: int,
                       barrier: TurnBarrier | None) -> None:
        self._traj_counter += 1
        tid = f"{tag}-{group_id}-{self._traj_counter}"
        traj = Trajectory(trajectory_id=tid, tag=tag, group_id=group_id, start_version=version)
        sample_seed = _keyed_seed(self.seed, "sample", self._traj_counter)
        gate = self._gate if self._gate is not None and not self._gate.is_open else None
        mgr = self._manager(traj, env_seed, sample_seed, barrier, gate)
        task = asyncio.create_task(self._run(mgr), name=f"traj-{tid}")
        self.running[tid] = (mgr, task)
        self.launched += 1
        self.launched_by_tag[tag] += 1

    # ------------------------------------------------------------------ failures
    def _replace_dropped_groups(self) -> None:
        """The groups the buffer dropped whole since the last look (``events``)."""
        for tag, group_id in self.events.take_dropped_groups():
            self._group_dropped(tag, group_id)

    def _group_dropped(self, tag: str, group_id: str) -> None:
        """The buffer dropped a group (a failure, or stale): in quota modes its share of
        the batch would never arrive, so grant a replacement group."""
        self._groups.pop(group_id, None)
        if self._quota is None or self._stopped or self._quota_closed:
            return
        # Only when the task's share of the batch can no longer be met by what is running,
        # finished or still allowed (a redundant rollout may have enough already).
        running = sum(1 for m, _ in self.running.values() if m.traj.tag == tag)
        reruns = sum(1 for t in self._delayed if t.get_name() == f"rerun-{tag}")
        have = running + reruns + self.buffer.held_by_tag(tag) + self._quota.get(tag, 0)
        if have < (self.batch_quota or {}).get(tag, 0):
            self._quota[tag] = self._quota.get(tag, 0) + self.group_size
            self._wakeup.set()

    def _note_outcome(self, traj: Trajectory) -> None:
        """Track consecutive failures per task; a failing task backs off."""
        tag = traj.tag
        if traj.dropped is None:
            self._fails[tag] = 0
            self._not_before.pop(tag, None)
        elif is_failure(traj.dropped):
            k = self._fails[tag] = self._fails.get(tag, 0) + 1
            if k == FAILING_IN_A_ROW and tag not in self._said_failing:  # it slows the run
                self._said_failing.add(tag)
                self._say(
                    f"warning: task {tag!r}: its last {k} trajectories failed (the latest: "
                    f"{(traj.dropped or '')[:300]}); each of its launches now waits up to "
                    f"{MAX_BACKOFF_S:g} s until one succeeds (drops.jsonl has every reason; "
                    "the watchdog stops the run if it keeps failing: rollout.max_drop_rate; "
                    "said once per task)")
            if k >= 2:
                delay = min(MAX_BACKOFF_S, 0.01 * 2 ** min(k, 12))
                self._not_before[tag] = time.monotonic() + delay

    def _should_rerun(self, traj: Trajectory) -> bool:
        info = self._groups.get(traj.group_id)
        return (info is not None and not self._stopped and is_failure(traj.dropped)
                and not (traj.dropped or "").startswith(NOT_RERUN)
                and info[2] < self.max_member_retries
                and not self.buffer.is_discarded(traj.group_id))

    async def _rerun_later(self, traj: Trajectory, tag: str, env_seed: int) -> None:
        """Re-run a failed member from its group's env seed, after the task's backoff."""
        wait = self._not_before.get(tag, 0.0) - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        pool = self.pools.get(tag)
        while pool is not None and pool.free() < 1 and not self._stopped:
            await asyncio.sleep(0.05)  # a pooled task re-runs on a free environment
        if self._stopped or self.buffer.is_discarded(traj.group_id):
            self.buffer.member_abandoned(traj.group_id)
            return
        self.retried += 1
        # The group's start version stays its oldest member's (the buffer takes the min).
        self._launch_member(tag, traj.group_id, env_seed, self.version(), None)

    def _manager(self, traj: Trajectory, env_seed: int, sample_seed: int,
                 barrier: TurnBarrier | None, gate: StartGate | None = None) -> EnvManager:
        """The EnvManager for a new trajectory: its pooled environment's own (made once,
        reused episode after episode), or a fresh one for an unpooled task."""
        pool = self.pools.get(traj.tag)
        manager = EnvManager
        if self.tasks[traj.tag].gateway is not None:
            from rollart_sdk.control.agent_manager import AgentManager

            manager = AgentManager
        if pool is None:
            return manager(traj, env_seed, sample_seed, self.tasks[traj.tag], self.chat,
                           self.proxy, self._pick_env_worker(traj.tag), self.reward_worker,
                           self.version, self._emit, barrier=barrier, gate=gate)
        slot = pool.acquire()
        self._slot_of[traj.trajectory_id] = slot
        if slot.manager is None:
            slot.manager = manager(traj, env_seed, sample_seed, self.tasks[traj.tag], self.chat,
                                   self.proxy, slot.worker, self.reward_worker, self.version,
                                   self._emit, barrier=barrier, env_id=slot.env_id, gate=gate)
        else:
            slot.manager.next_episode(traj, env_seed, sample_seed, barrier=barrier,
                                      env_id=slot.env_id, gate=gate)
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

    def side_error(self, what: str, traj: Trajectory, exc: BaseException) -> None:
        """An error beside a trajectory's outcome (not of it): counted in ``events``."""
        self.events.side_error(what, traj, exc)

    @property
    def side_error_count(self) -> int:
        return self.events.side_error_count

    @property
    def side_errors(self) -> list[str]:
        return self.events.side_errors

    def _pick_env_worker(self, tag: str) -> WorkerHandle:
        workers = self.env_by_tag[tag]
        self._env_rr += 1
        return workers[self._env_rr % len(workers)]

    async def _run(self, mgr: EnvManager) -> Trajectory:
        traj = mgr.traj
        try:
            await mgr.run()
        except asyncio.CancelledError:
            traj.dropped = traj.dropped or "aborted:cancelled"
        except Exception as exc:  # noqa: BLE001 - a bug: counted, kept, and it ends the run
            traj.dropped = f"internal_error: {type(exc).__name__}: {exc}"[:1000]
            if self.fatal is None:
                self.fatal = exc
                self.fatal_traceback = traceback.format_exc()
        finally:
            self.running.pop(traj.trajectory_id, None)
            task = asyncio.current_task()
            if task is not None:
                self.landing[traj.trajectory_id] = (traj, task)
            try:
                await self._land(traj)
            except asyncio.CancelledError:
                # Cancelled at an await of its landing (returning its slot, the buffer's
                # lock): it was not counted yet; counted here, unless stop() already did.
                if traj.trajectory_id not in self._abandoned:
                    self._abandoned.add(traj.trajectory_id)
                    traj.dropped = traj.dropped or "aborted:cancelled"
                    self.buffer.count_drop(traj)
                raise
            finally:  # counted now: in the buffer (trained later), dropped, or re-run
                self.landing.pop(traj.trajectory_id, None)
        return traj

    async def _land(self, traj: Trajectory) -> None:
        """A finished trajectory's env slot back, its hooks run, and it counted: into the
        buffer, or dropped and re-run."""
        # Returning the env slot and the finish readers (logs, the watchdog) may fail, e.g.
        # a full disk: counted and reported, and the trajectory still lands below.
        try:
            await self._return_slot(traj)
        except Exception as exc:  # noqa: BLE001 - counted in side_errors
            self.side_error("returning its env slot", traj, exc)
        self._note_outcome(traj)
        self.events.finished(traj)  # its readers' errors are counted as side errors
        if traj.trajectory_id in self._abandoned:
            pass  # counted by stop()
        elif traj.dropped is not None and self._should_rerun(traj):
            self.buffer.count_drop(traj)
            tag, env_seed, retries = self._groups[traj.group_id]
            self._groups[traj.group_id] = (tag, env_seed, retries + 1)
            task = asyncio.create_task(self._rerun_later(traj, tag, env_seed),
                                       name=f"rerun-{tag}")
            self._delayed.add(task)
            task.add_done_callback(self._delayed.discard)
        else:
            await self.buffer.put(traj)
            self._replace_dropped_groups()  # its group, dropped whole now
            if not self.buffer.is_open(traj.group_id):
                self._groups.pop(traj.group_id, None)
        self._wakeup.set()


def _keyed_seed(seed: int, kind: str, index: int) -> int:
    """A seed determined by (run seed, kind, launch index) alone."""
    return random.Random(f"{seed}/{kind}/{index}").randrange(2**31)
