"""RolloutEvents: what happens to the rollout, written by the parts below the scheduler and
read by it and by the run's reporting, so that no part calls up into another.

One object per run, created by the composition root (:func:`rollart_sdk.job.wire.wire_control_plane`)
and handed to the :class:`~rollart_sdk.control.buffer.SampleBuffer`, the
:class:`~rollart_sdk.control.scheduler.RolloutScheduler` and the
:class:`~rollart_sdk.control.weight_updates.WeightUpdates` by their constructors. It holds:

- ``wakeup``: set when something that may let the scheduler launch changed: the buffer
  freed room (a batch taken, groups evicted or filtered, the rest discarded), the
  engines' version changed or an update was held back (weight updates), a trajectory
  landed. The scheduler's launch loop awaits it and clears it before each wait;
- the groups the buffer dropped whole (a failed member, dynamic sampling, staleness),
  queued: the scheduler drains them (:meth:`take_dropped_groups`) right after each of
  its ``put`` calls and at the top of its launch loop, and grants a replacement group in
  quota modes;
- the finished-trajectory stream (:meth:`finished`, written by the scheduler as each
  trajectory lands) and the dropped-trajectory stream (:meth:`dropped`, written by the
  buffer as it counts one), each with its readers fixed at construction (the run's
  watchdog, the run directory's logs, the sample log): nobody appends a reader later;
- the side errors: a reader that raised (or another error beside a trajectory's outcome,
  e.g. returning its env slot) is counted here, the first few kept for ``summary.json``
  and the first printed once; the trajectory's outcome stands.

Nothing here imports another control-plane module: it sits below every part that uses it.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollart_sdk.types import Trajectory

Reader = Callable[["Trajectory"], None]
MAX_SIDE_ERRORS_KEPT = 20


class RolloutEvents:
    """The rollout's shared signals and trajectory streams (module docstring)."""

    def __init__(self, on_finish: Iterable[Reader] = (), on_drop: Iterable[Reader] = ()) -> None:
        self.wakeup = asyncio.Event()
        self._dropped_groups: deque[tuple[str, str]] = deque()
        self._on_finish = tuple(on_finish)
        self._on_drop = tuple(on_drop)
        self.side_error_count = 0
        self.side_errors: list[str] = []

    @property
    def finish_readers(self) -> tuple[Reader, ...]:
        return self._on_finish

    # ------------------------------------------------------------------ written below
    def room(self) -> None:
        """The buffer freed room, or the engines' version changed: launch again if allowed."""
        self.wakeup.set()

    def group_dropped(self, tag: str, group_id: str) -> None:
        """The buffer dropped group ``group_id`` of task ``tag`` whole."""
        self._dropped_groups.append((tag, group_id))

    def finished(self, traj: Trajectory) -> None:
        """A trajectory finished (trained later, dropped or re-run): every reader sees it."""
        self._tell(self._on_finish, "on_finish", traj)

    def dropped(self, traj: Trajectory) -> None:
        """A trajectory was counted dropped, whatever decided it: every reader sees it."""
        self._tell(self._on_drop, "on_drop", traj)

    def _tell(self, readers: tuple[Reader, ...], stream: str, traj: Trajectory) -> None:
        for fn in readers:
            try:
                fn(traj)
            except Exception as exc:  # noqa: BLE001 - counted in side_errors
                self.side_error(f"{stream} {getattr(fn, '__qualname__', fn)}", traj, exc)

    # ------------------------------------------------------------------ read above
    def take_dropped_groups(self) -> list[tuple[str, str]]:
        """The groups dropped whole since the last call, oldest first: ``(tag, group_id)``."""
        out = list(self._dropped_groups)
        self._dropped_groups.clear()
        return out

    def side_error(self, what: str, traj: Trajectory, exc: BaseException) -> None:
        """An error beside a trajectory's outcome (not of it): counted, the first few kept
        (summary.json ``side_errors``) and printed once."""
        self.side_error_count += 1
        text = (f"{what} for trajectory {traj.trajectory_id} ({traj.tag}): "
                f"{type(exc).__name__}: {exc}")
        if len(self.side_errors) < MAX_SIDE_ERRORS_KEPT:
            self.side_errors.append(text[:500])
        if self.side_error_count == 1:
            print(f"rollart: {text} (the trajectory is kept; later such errors are only "
                  "counted in summary.json side_errors)", file=sys.stderr, flush=True)
