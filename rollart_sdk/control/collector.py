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
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 20_000


@contextmanager
def driver_collector(young: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """Freeze what exists now and raise the young generation's threshold to ``young``
    for the duration (never lowering it); restore both on exit."""
    if not gc.isenabled():
        yield
        return
    before, was_frozen = gc.get_threshold(), gc.get_freeze_count() > 0
    gc.freeze()
    gc.set_threshold(max(before[0], young), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if not was_frozen:  # a caller who froze before the run keeps its frozen heap
            gc.unfreeze()
