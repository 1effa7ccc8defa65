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
import contextvars
import itertools
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
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


class _DaemonThreads:
    """Threads for blocking env calls, apart from the loop's default executor. Daemon
    threads: one stuck in a hung env holds neither ``asyncio.run``'s end (it waits for the
    default executor's threads) nor the process's exit, and takes no thread from any other
    ``asyncio.to_thread`` caller. An idle thread is reused, and ends after ``_IDLE_EXIT_S``.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[Future[Any], contextvars.Context,
                                             Callable[..., Any], tuple[Any, ...]]]
        self._queue = queue.SimpleQueue()
        # Threads waiting for work with none promised to them (every thread waiting on the
        # queue is either idle or promised to an item already queued).
        self._idle = 0
        self._started = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._lock:
            spawn = self._idle == 0
            if spawn:
                self._started += 1
                number = self._started
            else:
                self._idle -= 1
        self._queue.put((fut, contextvars.copy_context(), fn, args))
        if spawn:
            try:
                threading.Thread(target=self._work, name=f"{self.name}-{number}",
                                 daemon=True).start()
            except RuntimeError as exc:  # "can't start new thread": the item is skipped
                fut.set_exception(EnvCallError(
                    f"{self.name}: could not start a thread for the env call: {error_text(exc)}"))
        return fut

    def _work(self) -> None:
        while True:
            try:
                fut, ctx, fn, args = self._queue.get(timeout=_IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # nothing promised to a waiting thread: end one
                        self._idle -= 1
                        return
                continue  # an item is promised to a waiting thread: wait on
            if fut.done():  # its own thread could not start: another item is promised
                continue
            if fut.set_running_or_notify_cancel():
                try:
                    result = ctx.run(fn, *args)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(exc)
                else:
                    fut.set_result(result)
            del fut, ctx, fn, args  # hold nothing of the call while idle
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
        call = next(self._ids)
        with self._lock:
            self._calls[call] = (tag, method, now, now + timeout_s)
        fut = self._threads.submit(fn, *args)
        # Leaves the count when the call returns (or is cancelled before it started).
        fut.add_done_callback(lambda _f: self._done(call))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout_s)
        except TimeoutError:
            with self._lock:
                self.timed_out += 1
            raise EnvHung(
                f"no {method} within {timeout_s}s from the env of task {tag!r} "
                "(env_host: thread: its thread runs on, it cannot be killed)",
                killed=False) from None

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


if TYPE_CHECKING:  # mypy checks the host against the env role's Protocol
    _conforms: type[EnvHost] = ThreadEnvWorker
