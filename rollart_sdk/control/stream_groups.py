"""``train.stream_groups``: a sync step's groups sent to the trainer as they complete.

The pipeline takes a sync batch group by group (``Pipeline._stream_batch``); the groups
that complete while the batch is short go to the trainer's ``accumulate`` through
:class:`StreamedParts`, and :func:`stream_pays` says (``auto``) whether the next step does
that at all."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rollart_sdk.cluster.handles import WorkerHandle
from rollart_sdk.cluster.shards import shard_batch
from rollart_sdk.types import Trajectory

# train.stream_groups auto: a sync step sends its groups to the trainer as they complete
# when the step before had a tail (first group complete -> batch whole) at least this
# many times its training time. Sending them costs: per-group passes are less efficient than one, and they take
# CPU from the episodes still running. On the small FrozenLake workload (2 cores) runs
# without env latency (tail ~0.3x the training) lost 11-15% with every step streamed; with
# a long-tailed latency (tail ~4x) the exposed training halved (docs/benchmarks.md).
STREAM_SPREAD_FACTOR = 2.0


def stream_pays(spread_s: float, train_s: float) -> bool:
    """Whether the next sync step sends its groups early: the last step's tail was long
    enough to hide their training in (``STREAM_SPREAD_FACTOR``)."""
    return spread_s >= STREAM_SPREAD_FACTOR * train_s


class StreamedParts:
    """The groups of one sync step sent to the trainer as they complete
    (``train.stream_groups``): one ``accumulate`` call at a time, in order; groups that
    complete while a call runs go together in the next one (fewer, larger forward
    passes)."""

    def __init__(self, step: int, trainer: WorkerHandle,
                 span: Callable[[str, str, float, int], None]) -> None:
        self.step = step
        self.sent = 0  # trajectories sent (a prefix of the step's batch)
        self._trainer = trainer
        self._span = span
        self._queue: list[Trajectory] = []
        self._worker: asyncio.Task[None] | None = None

    def send(self, groups: list[Trajectory]) -> None:
        self.sent += len(groups)
        self._queue.extend(groups)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.ensure_future(self._accumulate(self._worker))

    async def _accumulate(self, before: asyncio.Task[None] | None) -> None:
        if before is not None:
            await before  # done; a failed part fails every later one
        while self._queue:
            groups, self._queue = self._queue, []
            samples = [s for t in groups for s in t.to_samples()]
            t0 = time.perf_counter()
            await self._trainer.trainer.accumulate(shard_batch(samples, [self._trainer])[0])
            self._span("accumulate", self._trainer.name, t0, self.step)

    async def drain(self) -> None:
        """Every part sent has run (raises a part's error)."""
        if self._worker is not None:
            await self._worker

    def cancel(self) -> None:
        """The step will not train (the run stopped or failed): stop the parts."""
        last = self._worker
        if last is None:
            return
        if last.done():
            if not last.cancelled():
                last.exception()  # retrieved: the run's own error is the one said
        else:
            last.cancel()
