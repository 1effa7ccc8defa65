"""``env_host: thread``: envs built in the EnvManagers' process, each call on a thread.

For envs that wait (a remote API, a sleep) rather than compute: no process per env, no Ray
hop, and the event loop keeps running while they wait. The envs are built and called by an
:class:`~rollart_sdk.cluster.envs.inline.InlineEnvWorker`; this host runs each call on a
thread of its own.

A thread-hosted call that hangs is given up at its timeout (``reset_timeout_s`` /
``step_timeout_s``: the trajectory is dropped with the reason, its slot's env replaced), but
its thread cannot be killed and stays stuck until the env returns. Those threads are the
host's own daemon threads, apart from the loop's default executor: a hung env starves no
other ``asyncio.to_thread`` caller (rewards, engine recovery), and holds neither the end of
``asyncio.run`` (which waits for its executor's threads) nor the process's exit. Calls still
running past their timeout count as hung (``stats()["hung"]``, ``envs.threads`` in
summary.json); at :data:`MAX_HUNG_CALLS` the host refuses new calls at once with the reason
(use ``env_host: worker``), so the run's drop-rate watchdog stops a run whose env keeps
hanging instead of it leaking a thread per hang; a hung call that returns frees its place.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import itertools
import queue
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rollart_sdk.cluster.envs.errors import EnvCallError, EnvHung, error_text
from rollart_sdk.cluster.envs.inline import InlineEnvWorker

if TYPE_CHECKING:
    from rollart_sdk.cluster.hosts import EnvHost

THREAD_NAME = "env-thread"
# A thread host refuses new calls while this many of its calls run past their timeout
# (hung: each holds a thread that cannot be killed).
MAX_HUNG_CALLS = 8
# A thread-hosted env's close is given up after this long (under the 10 s that
# control.env_pool.close_instance allows, so its text is the one reported).
CLOSE_TIMEOUT_S = 8.0
_IDLE_EXIT_S = 30.0  # an idle host thread ends after this long


class _Call:
    """One env call handed to a host thread: what to run, the loop future that gets its
    outcome, and its state: queued, running, given up by its caller before a thread
    started it (``DROPPED``: the thread promised to it takes the next item), or queued
    without a thread promised to it (``ORPHANED``: its thread could not start)."""

    __slots__ = ("fn", "args", "ctx", "fut", "state", "on_return", "outcome")
    QUEUED, RUNNING, DROPPED, ORPHANED = 0, 1, 2, 3

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...],
                 fut: asyncio.Future[Any], on_return: Callable[[], None]) -> None:
        self.fn, self.args, self.fut, self.on_return = fn, args, fut, on_return
        self.ctx = contextvars.copy_context()
        self.state = _Call.QUEUED
        self.outcome: tuple[Any, BaseException | None] = (None, None)


class _Completions:
    """Calls a host thread finished, handed to their event loop in batches: a thread
    appends its call and wakes the loop only when no hand-over is pending, so calls that
    end together cost the loop one wake-up (``call_soon_threadsafe`` writes to the loop's
    self-pipe), not one each. A pending hand-over takes every call appended before it
    runs; one appended while it runs schedules the next (``pending`` is cleared first)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # weak: the host's table of these is keyed by it
        self.done: collections.deque[_Call] = collections.deque()
        self.pending = False

    def add(self, call: _Call) -> None:  # on a host thread
        self.done.append(call)
        if not self.pending:
            self.pending = True
            loop = self._loop()
            try:
                if loop is None:
                    raise RuntimeError("the loop is gone")
                loop.call_soon_threadsafe(self._hand_over)
            except RuntimeError:  # the loop is closed: nobody waits for these any more
                self.done.clear()
                self.pending = False

    def _hand_over(self) -> None:  # on the loop
        self.pending = False
        done = self.done
        while done:
            call = done.popleft()
            if call.fut.done():  # given up at its timeout, or cancelled
                continue
            result, exc = call.outcome
            if exc is None:
                call.fut.set_result(result)
            else:
                call.fut.set_exception(exc)


class _DaemonThreads:
    """Threads for blocking env calls, apart from the loop's default executor. Daemon
    threads: one stuck in a hung env holds neither ``asyncio.run``'s end (it waits for the
    default executor's threads) nor the process's exit, and takes no thread from any other
    ``asyncio.to_thread`` caller. An idle thread is reused, and ends after ``_IDLE_EXIT_S``.
    A call's outcome goes to its loop future through the loop's :class:`_Completions`
    (no ``concurrent.futures.Future``, no wrapping task: about 60 us less per call).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[_Call, _Completions]] = queue.SimpleQueue()
        # Threads waiting for work with none promised to them (every thread waiting on the
        # queue is either idle or promised to an item already queued).
        self._idle = 0
        self._started = 0
        self._sinks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Completions]
        self._sinks = weakref.WeakKeyDictionary()

    def submit(self, call: _Call) -> None:
        loop = call.fut.get_loop()
        sink = self._sinks.get(loop)
        if sink is None:
            sink = self._sinks[loop] = _Completions(loop)
        with self._lock:
            spawn = self._idle == 0
            if spawn:
                self._started += 1
                number = self._started
            else:
                self._idle -= 1
        self._queue.put((call, sink))
        if spawn:
            try:
                threading.Thread(target=self._work, name=f"{self.name}-{number}",
                                 daemon=True).start()
            except RuntimeError as exc:  # "can't start new thread": the item is skipped
                with self._lock:
                    skipped = call.state == _Call.QUEUED  # (else a thread took it first)
                    if skipped:
                        call.state = _Call.ORPHANED
                if skipped:
                    call.on_return()
                    call.fut.set_exception(EnvCallError(
                        f"{self.name}: could not start a thread for the env call: "
                        f"{error_text(exc)}"))

    def drop(self, call: _Call) -> bool:
        """Give up ``call`` if no thread started it yet (it never runs): True then."""
        with self._lock:
            if call.state != _Call.QUEUED:
                return False
            call.state = _Call.DROPPED
        return True

    def _work(self) -> None:
        while True:
            try:
                call, sink = self._queue.get(timeout=_IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # nothing promised to a waiting thread: end one
                        self._idle -= 1
                        return
                continue  # an item is promised to a waiting thread: wait on
            with self._lock:
                if call.state == _Call.ORPHANED:  # no thread was promised to it: this
                    continue  # one's promise is to an item still queued; take it
                run = call.state == _Call.QUEUED
                if run:
                    call.state = _Call.RUNNING
            if run:
                try:
                    call.outcome = (call.ctx.run(call.fn, *call.args), None)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    call.outcome = (None, exc)
                call.on_return()  # here, not on the loop: it may have ended meanwhile
                sink.add(call)
            del call, sink  # hold nothing of the call while idle
            with self._lock:
                self._idle += 1


class ThreadEnvWorker:
    """``env_host: thread``: the env role's interface over envs built in this process, each
    call on a thread of this host's own (:class:`_DaemonThreads`). ``reset``/``step``/
    ``close`` are coroutines, awaited on the event loop: a call is given up at its timeout
    (:class:`~rollart_sdk.cluster.envs.errors.EnvHung` with ``killed`` False; its thread
    runs on, counted ``hung`` until the env returns),
    and refused at once while :data:`MAX_HUNG_CALLS` calls are hung."""

    role = "environment"

    def __init__(self, envs: dict[str, tuple[Any, ...]], name: str = THREAD_NAME,
                 max_hung: int = MAX_HUNG_CALLS) -> None:
        self.name = name
        self.max_hung = max(1, max_hung)
        self.local = InlineEnvWorker(envs, name)  # builds and calls the envs
        self._threads = _DaemonThreads(name)
        self._lock = threading.Lock()
        self._ids = itertools.count()
        # call id -> (task tag, method, started, deadline), from admission to return
        self._calls: dict[int, tuple[str, str, float, float]] = {}
        self._tags: dict[str, str] = {}  # env id -> its task, for the hung calls' report
        self.timed_out = 0
        self.refused = 0
        self.hung_peak = 0

    @property
    def constructions(self) -> dict[str, int]:
        return self.local.constructions

    def _hung(self, now: float) -> list[tuple[str, str, float, float]]:
        with self._lock:
            hung = [c for c in self._calls.values() if now > c[3]]
            self.hung_peak = max(self.hung_peak, len(hung))
        return hung

    def _admit(self, now: float) -> None:
        """Raise :class:`EnvCallError` (the reason, the fix) while too many calls hang."""
        hung = self._hung(now)
        if len(hung) < self.max_hung:
            return
        self.refused += 1
        tags = sorted({tag for tag, *_ in hung})
        kinds = Counter(method for _, method, *_ in hung)
        over = max(now - deadline for *_, deadline in hung)
        raise EnvCallError(
            f"refused: {len(hung)} env calls of env_host: thread task(s) "
            f"{', '.join(map(repr, tags))} hung past their timeout and still hold threads of "
            "this process (a thread cannot be killed); use env_host: worker (each env in its "
            "own process, killed at its timeout) or fix the hang. Calls are refused until "
            f"fewer than {self.max_hung} hang ("
            + ", ".join(f"{n} {m}" for m, n in sorted(kinds.items()))
            + f"; the oldest {over:.1f}s past its timeout)")

    def _done(self, call: int) -> None:
        with self._lock:
            self._calls.pop(call, None)

    async def _run(self, tag: str, method: str, timeout_s: float, admit: bool,
                   fn: Callable[..., Any], *args: Any) -> Any:
        now = time.monotonic()
        if admit:
            self._admit(now)
        call_id = next(self._ids)
        with self._lock:
            self._calls[call_id] = (tag, method, now, now + timeout_s)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        # Leaves the count when the call returns (or is given up before it started).
        call = _Call(fn, args, fut, lambda: self._done(call_id))
        self._threads.submit(call)
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            return await fut
        except (_Expired, asyncio.CancelledError) as exc:
            if self._threads.drop(call):  # never started: nothing runs on
                self._done(call_id)
            if not isinstance(exc, _Expired):
                raise
            with self._lock:
                self.timed_out += 1
            raise EnvHung(
                f"no {method} within {timeout_s}s from the env of task {tag!r} "
                "(env_host: thread: its thread runs on, it cannot be killed)",
                killed=False) from None
        finally:
            timer.cancel()

    async def reset(self, env_id: str, tag: str, seed: int,
                    timeout_s: float = 30.0) -> tuple[str, dict[str, Any]]:
        """Construct the env (first reset) and reset it, within ``timeout_s``."""
        with self._lock:
            self._tags[env_id] = tag
        out: tuple[str, dict[str, Any]] = await self._run(
            tag, "reset", timeout_s, True, self.local.reset, env_id, tag, seed, timeout_s)
        return out

    async def step(self, env_id: str, action: str,
                   timeout_s: float = 30.0) -> tuple[str, float, bool, bool, dict[str, Any]]:
        out: tuple[str, float, bool, bool, dict[str, Any]] = await self._run(
            self._tags.get(env_id, "?"), "step", timeout_s, True, self.local.step, env_id,
            action, timeout_s)
        return out

    async def close(self, env_id: str) -> str | None:
        """Close the env on a thread (always admitted: an env left open leaks more);
        returns the close error's text, if any (never raises)."""
        with self._lock:
            tag = self._tags.pop(env_id, "?")
        try:
            out: str | None = await self._run(tag, "close", CLOSE_TIMEOUT_S, False,
                                              self.local.close, env_id)
        except EnvHung:
            return (f"env close did not return within {CLOSE_TIMEOUT_S:g}s (env_host: "
                    "thread: its thread runs on, it cannot be killed)")
        except EnvCallError as exc:
            return str(exc)
        return out

    def stats(self) -> dict[str, Any]:
        """The inline host's stats, plus ``hung`` (calls running past their timeout now,
        each holding a thread), ``hung_peak`` (the most seen at once, at a call or a stats
        read), ``timed_out`` (calls given up at their timeout) and ``refused`` (calls
        refused while ``max_hung`` calls hung)."""
        return {**self.local.stats(), "hung": len(self._hung(time.monotonic())),
                "hung_peak": self.hung_peak, "timed_out": self.timed_out,
                "refused": self.refused, "max_hung": self.max_hung}

    def shutdown(self) -> None:
        self.local.shutdown()


class _Expired(TimeoutError):
    """A thread-hosted call past its timeout (its thread runs on)."""


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


if TYPE_CHECKING:  # mypy checks the host against the env role's Protocol
    _conforms: type[EnvHost] = ThreadEnvWorker
