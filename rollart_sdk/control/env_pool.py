"""Environment pools: each task's environments live across episodes, as in the paper.

A pool holds ``size`` slots per task. A slot is one environment instance on one env
worker, with its long-lived :class:`~rollart_sdk.control.env_manager.EnvManager`: reset ->
episode -> reset -> episode ... The worker builds the instance at the slot's first reset
(so a slot never used costs nothing) and keeps it; the pool closes it at the end of the
run, or when an episode failed in the environment itself (reset/step raised or timed
out). A failed slot gets a new instance id, so the worker builds a fresh one at the next
reset: the failed instance is replaced, never reused. Slots already built are handed out
first, so constructions stay at the number of slots a task needs at once.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

from rollart_sdk.cluster.handles import WorkerHandle
from rollart_sdk.control.aio import wait_for

# Drop reasons that mean the environment instance itself is broken (not an abort).
ENV_FAILURES = ("env_reset_failed", "env_reset_timeout", "env_step_failed", "env_step_timeout")


@dataclass
class EnvSlot:
    """One pooled environment: where it lives and what it has done."""

    tag: str
    index: int
    worker: WorkerHandle
    manager: Any = None  # the slot's EnvManager, made by the scheduler
    generation: int = 0  # bumped when the instance is replaced after a failure
    busy: bool = False
    built: bool = False  # the worker has constructed this generation's instance
    episodes: int = 0
    failures: int = 0

    @property
    def env_id(self) -> str:
        return f"{self.tag}/env{self.index}.{self.generation}"


@dataclass
class EnvPool:
    """The slots of one task."""

    tag: str
    slots: list[EnvSlot] = field(default_factory=list)
    reset_s: list[float] = field(default_factory=list)  # reset times since the last report
    failures: int = 0
    replaced: int = 0
    # Free slots as two heaps of indices (built ones are handed out first): acquire and
    # free() cost O(log n), not O(pool size) - the scheduler asks at every launch.
    _free_built: list[int] = field(default_factory=list, repr=False)
    _free_new: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        for s in self.slots:
            if not s.busy:
                heapq.heappush(self._free_built if s.built else self._free_new, s.index)

    @classmethod
    def spread(cls, tag: str, size: int, workers: list[WorkerHandle], offset: int = 0) -> EnvPool:
        """``size`` slots round-robin over ``workers`` (starting at ``offset``)."""
        if size < 1 or not workers:
            raise ValueError(f"task {tag!r}: an env pool needs size >= 1 and an env worker")
        return cls(tag, [EnvSlot(tag, i, workers[(offset + i) % len(workers)]) for i in range(size)])

    def free(self) -> int:
        return len(self._free_built) + len(self._free_new)

    def acquire(self) -> EnvSlot:
        """A free slot, one whose instance is already built first (lowest index first)."""
        heap = self._free_built or self._free_new
        if not heap:
            raise RuntimeError(f"task {self.tag!r}: no free environment in the pool")
        slot = self.slots[heapq.heappop(heap)]
        slot.busy = True
        return slot

    def release(self, slot: EnvSlot, dropped: str | None, reset_s: float | None) -> bool:
        """Return a slot after an episode; True when its instance failed and is replaced."""
        slot.busy = False
        slot.episodes += 1
        if reset_s is not None:
            slot.built = True
            self.reset_s.append(reset_s)
        failed = dropped is not None and dropped.startswith(ENV_FAILURES)
        if failed:
            slot.failures += 1
            self.failures += 1
            self.replaced += 1
            slot.generation += 1
            slot.built = False
        heapq.heappush(self._free_built if slot.built else self._free_new, slot.index)
        return failed

    def metrics(self) -> dict[str, float]:
        """Per-task figures since the last call (reset times) and totals (the rest)."""
        out = {
            f"env/failures/{self.tag}": float(self.failures),
            f"env/pool/{self.tag}": float(len(self.slots)),
            f"env/episodes/{self.tag}": float(sum(s.episodes for s in self.slots)),
        }
        if self.reset_s:
            out[f"env/reset_s/{self.tag}"] = sum(self.reset_s) / len(self.reset_s)
            self.reset_s.clear()
        return out


async def close_instance(worker: WorkerHandle, env_id: str, timeout: float = 10.0) -> str | None:
    """Close one instance on its worker; the error text if that failed (never raises)."""
    try:
        # The host answers the env's own close error as text (None: closed cleanly).
        return await wait_for(worker.env.close(env_id), timeout)
    except Exception as exc:  # noqa: BLE001 - closing a broken env must not stop the run
        return f"{type(exc).__name__}: {exc}"
