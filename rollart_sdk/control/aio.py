"""asyncio helpers the control plane relies on.

:func:`wait_for` is ``asyncio.wait_for`` with two differences:

- No lost cancellation: on Python 3.11, when the awaited call finishes in the same loop
  iteration as the waiting task is cancelled, ``asyncio.wait_for`` returns the result and
  the cancellation is gone (fixed in 3.12, where ``wait_for`` is ``asyncio.timeout``). The
  run's stop cancels its train step that way: a swallowed cancel let the step go on and
  count its batch as trained after the stop had already counted it dropped, so a
  SIGTERM'd run in CI counted 8 trajectories twice.
- No timer, task or future per call. The awaitable runs in the calling task (as in
  ``asyncio.timeout``), and the deadlines of every pending call share one loop timer
  (:class:`Deadlines`). Every turn of every trajectory waits for its env and engine calls
  this way: with ``asyncio.wait_for`` each call added a task, a waiter future and a timer
  to the loop, and the loop's timer heap held one timer per call in flight (about 1,900
  at 2,048 trajectories in flight, most of them these timeouts, which almost never fire),
  so every timer any part of the driver set cost O(log) of that heap
  (docs/benchmarks.md, ``rollart bench driver``).

The deadlines are exact: the calls that share a timeout expire in the order they started
(the clock never runs back), so :class:`Deadlines` keeps one insertion-ordered queue per
timeout value and adding or finishing a call is O(1); the loop's timer is set at the
earliest head and, when it fires, expires what is due and re-arms at the next head.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class _Deadline:
    __slots__ = ("task", "timeout", "when", "expired")

    def __init__(self, task: asyncio.Task[object], timeout: float, when: float) -> None:
        self.task = task
        self.timeout = timeout  # its queue's key
        self.when = when
        self.expired = False


class Deadlines:
    """The pending :func:`wait_for` deadlines of one event loop, on one loop timer.

    ``queues[timeout]`` holds the pending calls with that timeout in the order they
    started, which is also the order of their deadlines; a finished call leaves its queue
    at once (O(1)), an expired one is cancelled by the timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # weak: the loop holds this table, not the reverse
        self.queues: dict[float, OrderedDict[_Deadline, None]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    @property
    def timer(self) -> asyncio.TimerHandle | None:
        """The one loop timer (None while nothing is pending or after the last fired)."""
        return self._timer

    def add(self, task: asyncio.Task[object], timeout: float) -> _Deadline:
        loop = self._loop()
        assert loop is not None  # a task of the loop is running: it is alive
        entry = _Deadline(task, timeout, loop.time() + timeout)
        queue = self.queues.get(timeout)
        if queue is None:
            queue = self.queues[timeout] = OrderedDict()
        queue[entry] = None
        if self._timer is None or entry.when < self._timer.when():
            self._arm(loop, entry.when)
        return entry

    def discard(self, entry: _Deadline) -> None:
        """The call finished (or expired): forget it. The timer stays where it is (when
        it fires early it only re-arms), unless nothing is pending any more."""
        queue = self.queues.get(entry.timeout)
        if queue is not None and queue.pop(entry, 0) is None and not queue:
            del self.queues[entry.timeout]
            if not self.queues and self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        heads: list[float] = []
        for key in list(self.queues):
            queue = self.queues[key]
            while queue:
                entry = next(iter(queue))
                if entry.when > now:
                    heads.append(entry.when)
                    break
                queue.popitem(last=False)
                entry.expired = True
                entry.task.cancel()
            if not queue:
                del self.queues[key]
        if heads:
            self._arm(loop, min(heads))


# For a loop that takes no attributes (a compiled one); the others hold their own table.
_DEADLINES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Deadlines] = (
    weakref.WeakKeyDictionary())
_ATTR = "_rollart_deadlines"


def deadlines(loop: asyncio.AbstractEventLoop) -> Deadlines:
    """``loop``'s :class:`Deadlines` (made on first use, gone with the loop)."""
    found: Deadlines | None = getattr(loop, _ATTR, None)
    if found is None:
        found = _DEADLINES.get(loop)
    if found is None:
        found = Deadlines(loop)
        try:
            setattr(loop, _ATTR, found)
        except AttributeError:
            _DEADLINES[loop] = found
    return found


async def wait_for(awaitable: Awaitable[T], timeout: float | None) -> T:
    """``asyncio.wait_for(awaitable, timeout)``: ``TimeoutError`` after ``timeout``
    seconds, the awaitable cancelled; a cancellation of the calling task that arrives
    while it waits is raised even when the call finished at the same moment (its result
    is then dropped, as 3.12 drops it)."""
    task = asyncio.current_task()
    if task is None or timeout is None or timeout <= 0:
        return await _plain_wait_for(awaitable, timeout)
    before = task.cancelling()
    table = deadlines(task.get_loop())
    entry = table.add(task, timeout)
    try:
        result = await awaitable
    except asyncio.CancelledError as exc:
        if entry.expired and task.uncancel() <= before:
            raise TimeoutError from exc
        raise
    finally:
        table.discard(entry)
    if entry.expired:  # the awaitable swallowed the timeout's cancel and returned
        task.uncancel()
    if task.cancelling() > before:
        raise asyncio.CancelledError
    return result


async def _plain_wait_for(awaitable: Awaitable[T], timeout: float | None) -> T:
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    result = await asyncio.wait_for(awaitable, timeout)
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError
    return result
