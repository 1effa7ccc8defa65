"""SampleBuffer: scored trajectories waiting to be trained, handed out in whole GRPO groups.

Each trajectory carries the policy version that started it. A group's version is the
oldest of its members. When a batch is formed while the engines serve version ``n``, it
only takes groups started at ``>= n - alpha`` (the paper's bound); older groups are evicted
(counted, with the reason). Every trajectory that enters is either handed out in a batch
or counted as dropped; the buffer also keeps what waste and length bias are measured from
(dropped trajectories and generated tokens per task, turns of every finished episode).
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from rollart_sdk.types import Trajectory


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

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self._open: dict[str, Group] = {}
        self._ready: OrderedDict[str, Group] = OrderedDict()
        self._cond = asyncio.Condition()
        self.dropped: Counter[str] = Counter()  # reason -> trajectories
        self.trained = 0
        self.max_ready_trajectories = 0  # high-water mark, for the O(alpha * E) bound
        # Called whenever room is freed (a batch taken, groups evicted): the scheduler
        # listens so that it launches again.
        self.on_room: list[Callable[[], None]] = []
        # Groups dropped whole -> reason; members that finish later are counted under it.
        self._discarded: dict[str, str] = {}
        self.dropped_by_tag: Counter[str] = Counter()  # admission control counts on it
        self.tokens_dropped = 0  # generated tokens of dropped trajectories
        self.tokens_trained = 0  # generated tokens of trajectories handed out in batches
        # Episodes that ran to their end (trained or not), per task: [count, turns].
        self.finished_turns: dict[str, list[int]] = {}

    def _drop(self, t: Trajectory, reason: str | None = None) -> None:
        """Count one dropped trajectory (``reason`` overrides one not set yet)."""
        if reason is not None:
            t.dropped = reason
        assert t.dropped is not None
        self.dropped[t.dropped.split(": ", 1)[0]] += 1
        self.dropped_by_tag[t.tag] += 1
        self.tokens_dropped += t.generated_tokens

    # ------------------------------------------------------------------ producers
    async def put(self, traj: Trajectory) -> None:
        """Add a finished (scored or dropped) trajectory to its group."""
        async with self._cond:
            if traj.terminated or traj.truncated:
                c = self.finished_turns.setdefault(traj.tag, [0, 0])
                c[0] += 1
                c[1] += len(traj.turns)
            if traj.group_id in self._discarded:
                self._drop(traj, traj.dropped or self._discarded[traj.group_id])
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
            if len(usable) < 2:
                # GRPO needs at least two scored members to compare; count the rest.
                for t in usable:
                    self._drop(t, "group_incomplete")
                return
            group.members = usable
            self._ready[group.group_id] = group
            self.max_ready_trajectories = max(self.max_ready_trajectories, self.ready_trajectories)
            self._cond.notify_all()

    # ------------------------------------------------------------------ consumer
    @property
    def ready_trajectories(self) -> int:
        return sum(len(g.members) for g in self._ready.values())

    @property
    def ready_groups(self) -> int:
        return len(self._ready)

    def evict_older_than(self, min_version: int) -> list[Trajectory]:
        """Remove ready groups started before ``min_version``; returns the evicted."""
        evicted: list[Trajectory] = []
        for gid in [g for g, grp in self._ready.items() if grp.start_version < min_version]:
            for t in self._ready.pop(gid).members:
                self._drop(t, "stale")
                evicted.append(t)
        if evicted:
            self._notify_room()
        return evicted

    def _notify_room(self) -> None:
        for fn in self.on_room:
            fn()

    def ready_by_tag(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self._ready.values():
            out[g.tag] = out.get(g.tag, 0) + len(g.members)
        return out

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
                    ready = self.ready_by_tag()
                    if all(ready.get(tag, 0) >= n for tag, n in quota.items()):
                        break
                await self._cond.wait()
            batch: list[Trajectory] = []
            oldest_first = sorted(self._ready, key=lambda g: self._ready[g].start_version)
            if quota is None:
                for gid in oldest_first:
                    if len(batch) >= num_trajectories:
                        break
                    batch.extend(self._ready.pop(gid).members)
            else:
                need = dict(quota)
                for gid in oldest_first:
                    group = self._ready[gid]
                    if need.get(group.tag, 0) > 0:
                        need[group.tag] -= len(group.members)
                        batch.extend(self._ready.pop(gid).members)
            self.trained += len(batch)
            self.tokens_trained += sum(t.generated_tokens for t in batch)
            self._notify_room()
            return batch

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
            self._discarded[gid] = reason
        self._ready.clear()
        self._open.clear()
        if n:
            self._notify_room()
        return n
