"""Virtual time: an asyncio event loop whose clock jumps to the next timer.

:class:`VirtualTimeLoop` is an ordinary selector event loop with two changes:

- ``loop.time()`` reads a virtual clock (seconds since the simulation started);
- when nothing is ready to run (every task awaits something) and no thread is working,
  the loop does not sleep: it moves the clock to the earliest timer and fires it.

So ``await asyncio.sleep(3600)`` returns at once in wall time with ``loop.time()`` an
hour later, and ``asyncio.wait_for`` timeouts, ``call_later`` and every ``sleep`` in the
control plane run on the same clock. Work done in a thread (``asyncio.to_thread``,
``run_in_executor``) takes no virtual time: while a thread is busy the loop waits for it
in wall time, the clock stopped. Everything that should cost virtual time is a ``sleep``
of a modelled duration (the ``sim`` backends).

A loop in which every task waits, no timer is set and no thread is busy can never make
progress: it raises :class:`SimulationDeadlock` instead of hanging.

:func:`virtual_time` also points the ``time`` module name of the control-plane modules
(:data:`CLOCKED_MODULES`) at the virtual clock for the duration, so that the spans,
metrics and timeouts they measure with ``time.time()`` / ``perf_counter()`` /
``monotonic()`` are virtual seconds (``time.time()`` = the wall time the simulation
started + virtual seconds).
"""

from __future__ import annotations

import asyncio
import importlib
import selectors
import time as _real_time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

# Modules whose `time` name is pointed at the virtual clock while a simulation runs.
CLOCKED_MODULES = (
    "rollart_sdk.control.env_manager",
    "rollart_sdk.control.pipeline",
    "rollart_sdk.control.stream_groups",
    "rollart_sdk.control.scheduler",
    "rollart_sdk.control.watchdog",
    "rollart_sdk.control.recovery",
    "rollart_sdk.control.run_dir",
    "rollart_sdk.control.progress",
    "rollart_sdk.control.weight_updates",
    "rollart_sdk.control.checkpoints",
    "rollart_sdk.control.evaluation",
    "rollart_sdk.weights.staging",  # the exposed seconds of an engine's swap
)


class SimulationDeadlock(RuntimeError):
    """Every task waits, no timer is set and no thread works: nothing can ever happen."""


class _VirtualSelector(selectors.BaseSelector):
    """Wraps the loop's real selector (it still serves the self-pipe that threads use to
    wake the loop); a wait with a timeout becomes a jump of the virtual clock."""

    def __init__(self, real: selectors.BaseSelector, loop: VirtualTimeLoop) -> None:
        self._real = real
        self._loop = loop
        self._skipped = 0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # Only a thread (or a signal) writes to the loop's self-pipe: without one busy,
        # poll it now and then only (a poll per iteration is a tenth of a long run).
        self._skipped += 1
        if self._loop.threads_busy or self._skipped >= 64 or timeout is None:
            self._skipped = 0
            ready = self._real.select(0)
            if ready:
                return ready
        if timeout == 0:
            return []
        if self._loop.threads_busy:
            # A thread is working: wait for it in wall time (it writes to the self-pipe
            # when done); the virtual clock stands still meanwhile.
            return self._real.select(None if timeout is None else 1.0)
        if timeout is None:
            raise SimulationDeadlock(
                f"at virtual time {self._loop.time():.3f}s every task waits, no timer is "
                "set and no thread works: the simulation can never continue"
            )
        self._loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop on a virtual clock (see the module docstring)."""

    def __init__(self) -> None:
        self._vnow = 0.0
        self.threads_busy = 0
        super().__init__()
        self._selector = _VirtualSelector(self._selector, self)  # type: ignore[has-type]
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._vnow

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._vnow += seconds

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> asyncio.Future[Any]:  # type: ignore[override]
        fut = super().run_in_executor(executor, func, *args)
        self.threads_busy += 1

        def done(_: Any) -> None:
            self.threads_busy -= 1

        fut.add_done_callback(done)
        return fut


class VirtualClock:
    """Stands in for the ``time`` module inside :data:`CLOCKED_MODULES` during a run."""

    def __init__(self, loop: VirtualTimeLoop, epoch: float) -> None:
        self._loop = loop
        self.epoch = epoch

    def time(self) -> float:
        return self.epoch + self._loop.time()

    def perf_counter(self) -> float:
        return self._loop.time()

    def monotonic(self) -> float:
        return self._loop.time()

    def __getattr__(self, name: str) -> Any:  # strftime, sleep, ...: the real module's
        return getattr(_real_time, name)


@contextmanager
def virtual_time(loop: VirtualTimeLoop) -> Iterator[VirtualClock]:
    """Point the control plane's clocks at ``loop``'s virtual time until the block ends."""
    clock = VirtualClock(loop, _real_time.time())
    saved: list[tuple[Any, Any]] = []
    try:
        for name in CLOCKED_MODULES:
            mod = importlib.import_module(name)
            saved.append((mod, mod.time))
            mod.time = clock  # type: ignore[attr-defined]
        yield clock
    finally:
        for mod, original in saved:
            mod.time = original


def run_virtual(main: Awaitable[T]) -> tuple[T, float]:
    """Run ``main`` to completion on a fresh :class:`VirtualTimeLoop` with the control
    plane's clocks virtual; returns its result and the virtual seconds it took."""
    loop = VirtualTimeLoop()
    try:
        with virtual_time(loop):
            try:
                result = loop.run_until_complete(main)
                elapsed = loop.time()
            finally:  # on an error too: no task is left pending on a closed loop
                _cancel_rest(loop)
        return result, elapsed
    finally:
        loop.close()


def _cancel_rest(loop: VirtualTimeLoop) -> None:
    """Cancel tasks still pending at the end (as ``asyncio.run`` does)."""
    for _ in range(10):  # cancelling may start tasks (an ABORT sent for a cancelled call)
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        if not pending:
            break
        for t in pending:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    # Not loop.shutdown_default_executor(): it waits for a thread the loop does not count.
    executor = getattr(loop, "_default_executor", None)
    if executor is not None:
        executor.shutdown(wait=True)
