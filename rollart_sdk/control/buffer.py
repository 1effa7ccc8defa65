"""SampleBuffer: scored trajectories waiting to be trained, handed out in whole GRPO groups.

Each trajectory carries the policy version that started it. A group's version is the
oldest of its members. When a batch is formed while the engines serve version ``n``, it
only takes groups started at ``>= n - alpha`` (the paper's bound); older groups are evicted
(counted, with the reason). Every trajectory that enters is either handed out in a batch
or counted as dropped; the buffer also keeps what waste and length bias are measured from
(dropped trajectories and generated tokens per task, turns of every finished episode).

Groups are trained whole or not at all (group-preserving): the scheduler re-runs a failed
member from the group's env seed (``count_drop`` counts the failed attempt); a group that
still completes with a dropped member (its retries used up, or aborted) is dropped whole
as ``group_incomplete`` and queued in the run's
:class:`~rollart_sdk.control.events.RolloutEvents` (``group_dropped``), which the scheduler
drains to launch a replacement group in quota modes. See docs/failures.md.

Dynamic sampling (``rollout.filter_zero_variance``, DAPO's): a whole group whose rewards
are all equal gives GRPO no signal (every advantage is 0); it is dropped as
``zero_variance`` and queued the same way (the scheduler replaces it in quota modes;
admission control gives async the room back). At most
``max_filtered_per_step`` groups are filtered between two batches; past that cap such
groups are kept (trained as they are) and counted, so a task that gives no signal cannot
keep a step from filling.

The buffer never calls the scheduler: it writes into the ``RolloutEvents`` it is given
(room freed: ``room``; a group dropped whole: ``group_dropped``; a trajectory counted
dropped: ``dropped``), which the scheduler's loop awaits and drains.

What every trajectory's arrival and every wake-up of ``get_batch`` costs does not grow with
the groups waiting (issue 35): the ready trajectories are counted in total and per task as
groups come and go, and eviction finds the groups below the floor in a heap by start
version instead of scanning them all.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from rollart_sdk.control.events import RolloutEvents
from rollart_sdk.types import Trajectory

# Drops that are decisions of the control plane, by what decided them: the run's end, the
# staleness bound (rollout.alpha), the surplus of redundant rollout, the zero-variance
# filter. A group cut only by one of them drops its survivors as ``group_incomplete:<that>``;
# cut by anything else (a failure), as ``group_incomplete``.
DECISIONS = ("run_end", "stale", "surplus", "zero_variance")


def decided_by(reason: str) -> str | None:
    """The decision (one of :data:`DECISIONS`) a drop ``reason`` is, or None for a
    failure: ``stale``, ``aborted:stale``, ``group_incomplete:stale`` are ``stale``; the
    reason's first word (before ": ") counts."""
    kind = reason.split(": ", 1)[0].removeprefix("aborted:").removeprefix("group_incomplete:")
    return kind if kind in DECISIONS else None


def group_incomplete_reason(cut: set[str]) -> str:
    """The reason a group's survivors are dropped with, from its members' drop reasons."""
    causes = {decided_by(r) for r in cut}
    if len(causes) == 1 and None not in causes:
        return f"group_incomplete:{causes.pop()}"
    return "group_incomplete"


@dataclass
class Group:
    group_id: str
    tag: str
    size: int
    members: list[Trajectory] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.members) >= self.size

    @property
    def start_version(self) -> int:
        return min(t.start_version for t in self.members)

    @property
    def usable(self) -> list[Trajectory]:
        return [t for t in self.members if t.dropped is None]


class SampleBuffer:
    """Collects finished trajectories by group; ``get_batch`` blocks for whole groups."""

    def __init__(self, group_size: int, filter_zero_variance: bool = False,
                 max_filtered_per_step: int = 0, events: RolloutEvents | None = None) -> None:
        self.group_size = group_size
        # Where room freed, groups dropped whole and trajectories counted dropped are
        # written (the scheduler reads them; the run directory logs the drops).
        self.events = events if events is not None else RolloutEvents()
        self.filter_zero_variance = filter_zero_variance
        self.max_filtered_per_step = max_filtered_per_step
        self.filtered_groups = 0  # run total of groups dropped as zero_variance
        self.zero_variance_kept = 0  # run total of such groups kept past the cap
        # Since the last batch: groups filtered, kept past the cap (per task, with the
        # reward they all had); get_batch moves them to ``last_filter``.
        self._filtered_now = 0
        self._kept_now: dict[str, list[float | None]] = {}
        self.last_filter: tuple[int, dict[str, list[float | None]]] = (0, {})
        self._open: dict[str, Group] = {}
        self._ready: OrderedDict[str, Group] = OrderedDict()
        # Kept with ``_ready`` (``_add_ready`` / ``_pop_ready``): its trajectories in total
        # and per task; per group its start version and arrival number; a heap of
        # (start version, arrival, group) for eviction (entries of groups gone or of an
        # older start version are skipped; compacted when mostly such).
        self._ready_n = 0
        self._ready_tag: Counter[str] = Counter()
        self._ready_at: dict[str, tuple[int, int]] = {}
        self._by_version: list[tuple[int, int, str]] = []
        self._arrivals = 0
        self._cond = asyncio.Condition()
        self.dropped: Counter[str] = Counter()  # reason -> trajectories
        self.trained = 0
        self.max_ready_trajectories = 0  # high-water mark, for the O(alpha * E) bound
        # Groups dropped whole -> [reason, members still out]; members that finish later
        # are counted under it; an entry goes once its last member is counted.
        self._discarded: dict[str, list[Any]] = {}
        self.dropped_by_tag: Counter[str] = Counter()  # admission control counts on it
        self.tokens_dropped = 0  # generated tokens of dropped trajectories
        # ... of those this session's stop cut (``*run_end``): not waste (not carried on
        # resume: an earlier session's stop stays in tokens_dropped)
        self.tokens_run_end = 0
        self.tokens_trained = 0  # generated tokens of trajectories handed out in batches
        # Episodes that ran to their end (trained or not), per task: [count, turns]; and
        # what they scored: [rewarded, reward sum, judged (a "success" in their info),
        # successes]. Over every finished episode, not the batch: in async mode a batch
        # is the groups that completed first (more of the short episodes), which can say
        # less well what the policy does (``success_finished/<tag>``).
        self.finished_turns: dict[str, list[int]] = {}
        self.finished_outcomes: dict[str, list[float]] = {}

    def _count_outcome(self, traj: Trajectory) -> None:
        o = self.finished_outcomes.setdefault(traj.tag, [0, 0.0, 0, 0])
        if traj.reward is not None and math.isfinite(traj.reward):
            o[0] += 1
            o[1] += traj.reward
        if "success" in traj.info:
            o[2] += 1
            o[3] += 1 if traj.info["success"] else 0

    def _drop(self, t: Trajectory, reason: str | None = None) -> None:
        """Count one dropped trajectory (``reason`` overrides one not set yet)."""
        if reason is not None:
            t.dropped = reason
        assert t.dropped is not None
        self.dropped[t.dropped.split(": ", 1)[0]] += 1
        self.dropped_by_tag[t.tag] += 1
        self.tokens_dropped += t.generated_tokens
        if t.dropped.split(": ", 1)[0].endswith("run_end"):
            self.tokens_run_end += t.generated_tokens
        # Its readers (drops.jsonl) see it; a reader's error is a side error, the count stands.
        self.events.dropped(t)

    def count_drop(self, traj: Trajectory) -> None:
        """Count a dropped member that the scheduler re-runs (it never joins its group)."""
        self._drop(traj)

    def is_discarded(self, group_id: str) -> bool:
        return group_id in self._discarded

    def is_open(self, group_id: str) -> bool:
        return group_id in self._open

    def member_abandoned(self, group_id: str) -> None:
        """A discarded group's member will never arrive (its re-run was not launched)."""
        gone = self._discarded.get(group_id)
        if gone is not None:
            gone[1] -= 1
            if gone[1] <= 0:
                del self._discarded[group_id]

    def held_by_tag(self, tag: str) -> int:
        """Usable trajectories of ``tag`` finished and not trained (ready or in open groups)."""
        return (self._ready_tag[tag]
                + sum(len(g.usable) for g in self._open.values() if g.tag == tag))

    def held(self) -> int:
        """Trajectories finished but neither trained nor counted yet (ready groups and
        finished members of groups still running)."""
        return self.ready_trajectories + sum(len(g.members) for g in self._open.values())

    # ------------------------------------------------------------------ producers
    async def put(self, traj: Trajectory) -> None:
        """Add a finished (scored or dropped) trajectory to its group."""
        async with self._cond:
            if traj.terminated or traj.truncated:
                c = self.finished_turns.setdefault(traj.tag, [0, 0])
                c[0] += 1
                c[1] += len(traj.all_turns)
                self._count_outcome(traj)
            gone = self._discarded.get(traj.group_id)
            if gone is not None:
                self._drop(traj, traj.dropped or gone[0])
                gone[1] -= 1
                if gone[1] <= 0:
                    del self._discarded[traj.group_id]
                return
            group = self._open.get(traj.group_id)
            if group is None:
                group = self._open[traj.group_id] = Group(traj.group_id, traj.tag, self.group_size)
            group.members.append(traj)
            if not group.done:
                return
            del self._open[traj.group_id]
            for t in group.members:
                if t.dropped is not None:
                    self._drop(t)
            usable = group.usable
            if len(usable) < len(group.members):
                # Group-preserving: training the survivors alone would bias the group
                # toward the episodes that did not fail; drop it whole, count the rest
                # (as the stop's when only the run's end cut its other members).
                cut = {t.dropped for t in group.members if t.dropped is not None}
                why = group_incomplete_reason(cut)
                for t in usable:
                    self._drop(t, why)
                self.events.group_dropped(group.tag, group.group_id)
                return
            if self._filtered(group):
                return
            self._add_ready(group)
            self.max_ready_trajectories = max(self.max_ready_trajectories, self.ready_trajectories)
            self._cond.notify_all()

    def _filtered(self, group: Group) -> bool:
        """Dynamic sampling: drop a group whose rewards are all equal (its members counted
        as ``zero_variance``) and tell the listeners, unless this step's cap is reached
        (then it is kept and counted). True when it was dropped."""
        rewards = {t.reward for t in group.members}
        if not self.filter_zero_variance or len(rewards) > 1:
            return False
        reward = next(iter(rewards))
        if self._filtered_now >= self.max_filtered_per_step:
            self.zero_variance_kept += 1
            self._kept_now.setdefault(group.tag, []).append(reward)
            return False
        self._filtered_now += 1
        self.filtered_groups += 1
        for t in group.members:
            self._drop(t, f"zero_variance: all {len(group.members)} rewards of the group "
                          f"were {reward}")
        self.events.group_dropped(group.tag, group.group_id)
        self._notify_room()
        return True

    # ------------------------------------------------------------------ consumer
    @property
    def ready_trajectories(self) -> int:
        return self._ready_n

    def _add_ready(self, group: Group) -> None:
        self._ready[group.group_id] = group
        self._arrivals += 1
        version = group.start_version
        self._ready_at[group.group_id] = (version, self._arrivals)
        heapq.heappush(self._by_version, (version, self._arrivals, group.group_id))
        self._ready_n += len(group.members)
        self._ready_tag[group.tag] += len(group.members)

    def _pop_ready(self, group_id: str) -> Group:
        group = self._ready.pop(group_id)
        del self._ready_at[group_id]
        self._ready_n -= len(group.members)
        self._ready_tag[group.tag] -= len(group.members)
        if not self._ready_tag[group.tag]:
            del self._ready_tag[group.tag]
        if len(self._by_version) > 2 * len(self._ready) + 64:  # mostly entries of gone groups
            self._by_version = [(v, k, g) for g, (v, k) in self._ready_at.items()]
            heapq.heapify(self._by_version)
        return group

    @property
    def ready_groups(self) -> int:
        return len(self._ready)

    def evict_older_than(self, min_version: int) -> list[Trajectory]:
        """Remove ready groups started before ``min_version``; returns the evicted."""
        evicted: list[Trajectory] = []
        below: list[tuple[int, str]] = []
        heap = self._by_version
        while heap and heap[0][0] < min_version:
            version, arrival, gid = heapq.heappop(heap)
            if self._ready_at.get(gid) == (version, arrival):
                below.append((arrival, gid))
        for _, gid in sorted(below):  # in the order they became ready, as before
            group = self._pop_ready(gid)
            for t in group.members:
                self._drop(t, "stale")
                evicted.append(t)
            self.events.group_dropped(group.tag, gid)
        if evicted:
            self._notify_room()
        return evicted

    def _notify_room(self) -> None:
        self.events.room()

    def ready_by_tag(self) -> dict[str, int]:
        return dict(self._ready_tag)

    async def get_batch(
        self, num_trajectories: int, min_version: int, quota: dict[str, int] | None = None
    ) -> list[Trajectory]:
        """Block until whole groups are ready, evicting groups older than ``min_version``
        first; return them oldest first (by start version, so that the groups closest to
        the bound are trained before they fall out of it).

        Without ``quota``: groups of any task totalling ``num_trajectories`` (at least).
        With ``quota`` (task tag -> trajectories): each task's share, so that tasks whose
        trajectories finish faster (fewer turns) do not crowd out the slower ones.
        """
        async with self._cond:
            while True:
                self.evict_older_than(min_version)
                if quota is None:
                    if self.ready_trajectories >= num_trajectories:
                        break
                else:
                    if all(self._ready_tag[tag] >= n for tag, n in quota.items()):
                        break
                await self._cond.wait()
            batch: list[Trajectory] = []
            oldest_first = sorted(self._ready, key=lambda g: self._ready_at[g][0])
            if quota is None:
                for gid in oldest_first:
                    if len(batch) >= num_trajectories:
                        break
                    batch.extend(self._pop_ready(gid).members)
            else:
                need = dict(quota)
                for gid in oldest_first:
                    group = self._ready[gid]
                    if need.get(group.tag, 0) > 0:
                        need[group.tag] -= len(group.members)
                        batch.extend(self._pop_ready(gid).members)
            # Counted as trained once its train step returned (mark_trained), or as
            # dropped if the run stopped first (drop_untrained).
            self._end_batch()
            return batch

    async def take_groups(self, need: dict[str, int], min_version: int) -> list[Trajectory]:
        """A batch taken group by group (``train.stream_groups``): block until a ready
        group of a task in ``need`` (task tag -> trajectories still wanted) is there,
        evicting groups older than ``min_version`` first; take every ready group that a
        task still wants, oldest first, and lower ``need`` in place. Over the calls that
        bring every ``need`` to 0 or below, these are the groups :meth:`get_batch` with
        ``quota`` would take once they are all ready: each task's first ready groups."""
        async with self._cond:
            while True:
                self.evict_older_than(min_version)
                if any(n > 0 and self._ready_tag[tag] for tag, n in need.items()):
                    break
                await self._cond.wait()
            batch: list[Trajectory] = []
            for gid in sorted(self._ready, key=lambda g: self._ready_at[g][0]):
                group = self._ready[gid]
                if need.get(group.tag, 0) > 0:
                    need[group.tag] -= len(group.members)
                    batch.extend(self._pop_ready(gid).members)
            if all(n <= 0 for n in need.values()):
                self._end_batch()
            else:
                self._notify_room()
            return batch

    def _end_batch(self) -> None:
        """A batch is whole: the dynamic-sampling figures of its formation are its own."""
        self.last_filter = (self._filtered_now, self._kept_now)
        self._filtered_now, self._kept_now = 0, {}
        self._notify_room()

    def mark_trained(self, batch: list[Trajectory]) -> None:
        """``batch`` (from get_batch) was trained."""
        self.trained += len(batch)
        self.tokens_trained += sum(t.generated_tokens for t in batch)

    def drop_untrained(self, batch: list[Trajectory], reason: str) -> None:
        """``batch`` (from get_batch) was never trained: the run stopped before its step
        returned (a failure, Ctrl-C); each member is counted as dropped with ``reason``."""
        for t in batch:
            self._drop(t, reason)

    def redeem_untrained(self, batch: list[Trajectory], reason: str) -> None:
        """Undo :meth:`drop_untrained` (``reason``: its key) for a batch the trainer did
        train (its answer was lost when the run stopped): counted as trained."""
        for t in batch:
            self.dropped[reason] -= 1
            self.dropped_by_tag[t.tag] -= 1
            self.tokens_dropped -= t.generated_tokens
            if reason.endswith("run_end"):
                self.tokens_run_end -= t.generated_tokens
            t.dropped = None
        if self.dropped[reason] <= 0:
            del self.dropped[reason]
        self.mark_trained(batch)

    def ready_members(self) -> list[Trajectory]:
        """The trajectories of the ready groups (finished, whole groups, not handed out)."""
        return [t for g in self._ready.values() for t in g.members]

    def carry_in(self, trajectories: list[Trajectory]) -> None:
        """Resume: finished, untrained trajectories a checkpoint carried (whole groups) are
        ready again, as they were at the checkpoint (control/resume.py)."""
        for t in trajectories:
            t.dropped = None  # a save at the run's end saw them counted run_end
            group = self._ready.get(t.group_id)
            if group is None:
                group = Group(t.group_id, t.tag, self.group_size, [t])
                self._add_ready(group)
                continue
            group.members.append(t)
            self._ready_n += 1
            self._ready_tag[group.tag] += 1
            version, arrival = self._ready_at[group.group_id]
            if t.start_version < version:  # the old heap entry is skipped from now on
                self._ready_at[group.group_id] = (t.start_version, arrival)
                heapq.heappush(self._by_version, (t.start_version, arrival, group.group_id))

    def discard_all(self, reason: str) -> int:
        """Drop every group not handed out yet, ready or still running (e.g. the surplus of
        a redundant rollout once the batch is full). Members that finish later are counted
        under their own reason, or ``reason``. Returns trajectories dropped now."""
        n = 0
        for group in self._ready.values():
            for t in group.members:
                self._drop(t, reason)
                n += 1
        for gid, group in self._open.items():
            for t in group.members:
                if t.dropped is None:
                    self._drop(t, reason)
                    n += 1
                else:
                    self._drop(t)
            self._discarded[gid] = [reason, group.size - len(group.members)]
        self._ready.clear()
        self._ready_at.clear()
        self._by_version.clear()
        self._ready_tag.clear()
        self._ready_n = 0
        self._open.clear()
        if n:
            self._notify_room()
        return n
