"""The driver's garbage collector while a pipeline runs.

A run's driver holds every object of the built job (model config, workers' handles,
tokenizer tables) and, in flight, thousands of trajectories whose turns allocate many
short-lived objects. With Python's default thresholds a young-generation pass runs every
700 net allocations and each pass is slower the bigger the heap: at 2,048 trajectories in
flight the collector took 690-720 us of driver CPU per trajectory against 475-490 us at
256 (``rollart bench driver``, docs/benchmarks.md). During the run the objects built
before it are moved to the permanent generation (``gc.freeze``: no pass walks them again)
and the young generation collects every 20,000 net allocations instead of 700; both are
undone when the run ends. A user who switched the collector off keeps it off.

The young threshold also follows the trajectories in flight (:meth:`DriverCollector.fit`:
at the start from ``rollout.max_envs`` or the batch size, then once per training step from
the larger of that and the step's ``trajectories/in_flight``): ``YOUNG_PER_TRAJECTORY``
net allocations per trajectory in flight, at least ``YOUNG_THRESHOLD``, at most
``YOUNG_CAP``. A fixed threshold made the collector's share per trajectory grow with
concurrency: a turn's objects live until that turn of every other trajectory has run, so
with 8x the trajectories in flight 8x the passes fall inside their lives, each pass walks
the survivors, and the survivors promoted to the middle generation are walked again there
(``rollart bench driver``, medians: 25 us per trajectory at 256 in flight, 69 at 2,048
with 20,000; 30 at 2,048 when the threshold follows).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 20_000
YOUNG_PER_TRAJECTORY = 80  # 20,000 at 256 in flight, where the fixed threshold was tuned
YOUNG_CAP = 2_000_000  # at most this many young objects wait for a pass (~200 MB)


class DriverCollector:
    """The young threshold of a run (see the module's text); inert when the collector is
    off, so a user's ``gc.disable()`` is kept."""

    def __init__(self, young: int, active: bool) -> None:
        self.floor = young
        self.active = active
        self.young = young

    def fit(self, in_flight: int) -> int:
        """Set the young threshold for ``in_flight`` trajectories; returns it."""
        want = min(max(self.floor, YOUNG_PER_TRAJECTORY * max(in_flight, 0)), YOUNG_CAP)
        if self.active and gc.isenabled() and want != self.young:
            self.young = want
            gc.set_threshold(want, *gc.get_threshold()[1:])
        return self.young


@contextmanager
def driver_collector(young: int = YOUNG_THRESHOLD) -> Iterator[DriverCollector]:
    """Freeze what exists now and raise the young generation's threshold to ``young``
    for the duration (never lowering it); restore both on exit. The yielded
    :class:`DriverCollector` raises it further with the trajectories in flight."""
    if not gc.isenabled():
        yield DriverCollector(young, active=False)
        return
    before, was_frozen = gc.get_threshold(), gc.get_freeze_count() > 0
    gc.freeze()
    floor = max(before[0], young)
    gc.set_threshold(floor, *before[1:])
    try:
        yield DriverCollector(floor, active=True)
    finally:
        gc.set_threshold(*before)
        if not was_frozen:  # a caller who froze before the run keeps its frozen heap
            gc.unfreeze()
