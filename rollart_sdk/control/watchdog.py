"""The run-level watchdog: a run that cannot make progress stops, naming why.

Two rules (``rollout`` keys, docs/failures.md):

- drop rate: when a task's last ``drop_window`` finished trajectories include more than
  ``max_drop_rate`` failures (env, engine or reward errors and timeouts; decisions of the
  control plane such as stale or surplus aborts do not count), the run stops with
  :class:`RunFailure` naming the task and its most frequent drop reasons;
- stall: when nothing progresses (no trajectory scored, no step trained) for
  ``stall_timeout_s`` seconds, the run stops the same way. The clock starts when the run
  starts (and again after a restore: :meth:`Watchdog.restart`), not when the pipeline is
  built; until the first progress the limit is at least ``first_progress_s``, the
  longest a first episode may take by its task's timeouts (reset, each turn's generate
  and step, reward), so a long first episode (an SWE-like task) is not a stall.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable

from rollart_sdk.control.aio import wait_for
from rollart_sdk.control.scheduler import is_failure
from rollart_sdk.errors import RollartError
from rollart_sdk.types import Trajectory


class RunFailure(RollartError):
    """The watchdog stopped the run; ``task`` names the task at fault (None: all)."""

    def __init__(self, message: str, task: str | None = None) -> None:
        super().__init__(message)
        self.task = task


class Watchdog:
    def __init__(self, tags: list[str], window: int, max_drop_rate: float,
                 stall_timeout_s: float, clock: Callable[[], float] = time.monotonic,
                 first_progress_s: float = 0.0) -> None:
        self.window = window
        self.max_drop_rate = max_drop_rate
        self.stall_timeout_s = stall_timeout_s
        self.first_progress_s = first_progress_s
        self._progressed = False  # since the start / the last restart
        self._clock = clock
        self._recent: dict[str, deque[str | None]] = {t: deque(maxlen=window) for t in tags}
        self._examples: dict[str, dict[str, str]] = {t: {} for t in tags}  # first text per reason
        self._last_progress = clock()
        self.failure: RunFailure | None = None
        self._changed = asyncio.Event()

    def record(self, traj: Trajectory) -> None:
        """Called with every finished trajectory."""
        if traj.dropped is None:
            self.progress()
        elif not is_failure(traj.dropped):
            return
        recent = self._recent.setdefault(traj.tag, deque(maxlen=self.window))
        key = None if traj.dropped is None else traj.dropped.split(": ", 1)[0]
        recent.append(key)
        if key is not None:
            self._examples.setdefault(traj.tag, {}).setdefault(key, traj.dropped or "")
        if self.failure is None and len(recent) == self.window:
            failed = sum(1 for r in recent if r is not None)
            if failed / self.window > self.max_drop_rate:
                self.failure = RunFailure(
                    f"task {traj.tag!r}: {failed} of its last {self.window} trajectories were "
                    f"dropped (rollout.max_drop_rate {self.max_drop_rate:g}); top reasons: "
                    f"{self.top_reasons(traj.tag)}. Fix the cause (see docs/failures.md), "
                    "or raise rollout.max_drop_rate / rollout.drop_window",
                    task=traj.tag,
                )
                self._changed.set()

    def progress(self) -> None:
        self._last_progress = self._clock()
        self._progressed = True

    def pause(self, seconds: float) -> None:
        """``seconds`` of work that is not the rollout's (a held-out evaluation) do not
        count as idle."""
        self._last_progress += seconds

    def restart(self) -> None:
        """The run starts (or resumes after a restore): the stall clock starts now, and the
        first episode's budget applies again."""
        self._last_progress = self._clock()
        self._progressed = False

    @property
    def stall_limit_s(self) -> float:
        if self._progressed:
            return self.stall_timeout_s
        return max(self.stall_timeout_s, self.first_progress_s)

    def top_reasons(self, tag: str, k: int = 3) -> str:
        counts = Counter(r for r in self._recent.get(tag, ()) if r is not None)
        if not counts:
            return "none"
        examples = self._examples.get(tag, {})
        return "; ".join(f"{reason} x{n} (e.g. {examples.get(reason, reason)[:300]})"
                         for reason, n in counts.most_common(k))

    def check_stall(self) -> None:
        idle = self._clock() - self._last_progress
        limit = self.stall_limit_s
        if self.failure is None and idle > limit:
            worst = max(self._recent, key=lambda t: sum(1 for r in self._recent[t] if r), default=None)
            detail = f"; most drops in task {worst!r}: {self.top_reasons(worst)}" if worst else ""
            what = (f"rollout.stall_timeout_s {self.stall_timeout_s:g}" if limit == self.stall_timeout_s
                    else f"the first episode's budget {limit:g}s from the tasks' timeouts")
            self.failure = RunFailure(
                f"no progress for {idle:.0f}s ({what}): "
                f"no trajectory was scored and no step trained{detail}",
                task=worst,
            )

    async def wait(self, poll_s: float = 1.0) -> None:
        """Return never; raise :class:`RunFailure` once a rule trips."""
        while True:
            self.check_stall()
            if self.failure is not None:
                raise self.failure
            self._changed.clear()
            try:
                await wait_for(self._changed.wait(), poll_s)
            except TimeoutError:
                pass
