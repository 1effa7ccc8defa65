"""Cheap environments hosted inline: in the EnvManagers' own process, no hop per call.

An env whose ``reset``/``step`` take microseconds (FrozenLake, a text puzzle) costs far
more in transport than in work when every call is a Ray round trip or a pipe to its own
process (issue 12 measured 89 ms per reset and 15 ms per step through Ray against
microseconds of work). ``tasks[].env_host: inline`` (or ``auto`` with an env class that
declares ``step_cost = "cheap"``) builds such a task's envs here, and the
:class:`~rollart_sdk.cluster.handles.WorkerHandle` calls them directly on the event loop.
``env_host: thread`` builds them here too but runs each call on a thread of its own
(:class:`ThreadEnvWorker`): for envs that wait (a remote API, a sleep) rather than compute -
no process per env, no Ray hop, and the event loop keeps running while they wait.

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

What inline gives up, and why it is opt-in: the env shares the control plane's process.
A hung ``step`` cannot be killed (it would stall every trajectory), a crash of the env's
native code ends the run, and an env that sleeps blocks the loop. Heavy, slow or unsafe
envs keep ``env_host: worker`` (each env in its own killable process on the env role's
workers). Injected faults (``tasks[].env.faults``) need a worker host; the config says so.
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
from typing import Any

INLINE_NAME = "env-inline"
THREAD_NAME = "env-thread"
# A thread host refuses new calls while this many of its calls run past their timeout
# (hung: each holds a thread that cannot be killed).
MAX_HUNG_CALLS = 8
# A thread-hosted env's close is given up after this long (under the 10 s that
# control.env_pool.close_instance allows, so its text is the one reported).
CLOSE_TIMEOUT_S = 8.0
_IDLE_EXIT_S = 30.0  # an idle host thread ends after this long
_MAX_CLOSED_UNBUILT = 4096  # env ids remembered as closed before their env was built


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class InlineEnvCallError(RuntimeError):
    """The env raised (the text is the env's ``Type: message``, as a worker host sends), or
    a thread host refused the call (too many of its calls hung)."""


class InlineEnvHung(InlineEnvCallError):
    """A thread-hosted call did not return within its timeout (its thread runs on: it
    cannot be killed). The name says ``EnvHung``: the EnvManager drops the trajectory as
    ``env_<call>_timeout``, as for a worker host's killed env."""


class InlineEnvWorker:
    """The env role's interface (``reset``/``step``/``close``/``count``/``stats``/
    ``shutdown``) over envs built in this process. ``envs``: tag -> (descriptor, options)."""

    role = "environment"

    def __init__(self, envs: dict[str, tuple[Any, ...]], name: str = INLINE_NAME) -> None:
        self.name = name
        self._lock = threading.Lock()  # thread-hosted calls build envs concurrently
        self._specs = envs
        self._factories = {tag: spec[0].load() for tag, spec in envs.items()}
        self._envs: dict[str, Any] = {}
        # Env ids closed before their env was built: a thread-hosted first reset given up
        # at its timeout, whose slot was replaced and closed, may still build the env when
        # it returns; that env is closed then, not kept unowned (insertion-ordered, capped).
        self._closed_unbuilt: dict[str, None] = {}
        self.constructions: dict[str, int] = {}
        self.closed = 0
        self.closed_late = 0  # envs built after their id was closed, closed on arrival
        self.killed = 0  # an inline env cannot be killed; kept for the stats' shape

    def reset(self, env_id: str, tag: str, seed: int,
              timeout_s: float = 30.0) -> tuple[str, dict[str, Any]]:
        """``timeout_s`` is not enforced inline (nothing can stop a call in this process)."""
        from rollart_sdk.cluster.roles import _plain, text_observation

        env = self._envs.get(env_id)
        if env is None:
            if tag not in self._factories:
                raise KeyError(f"task {tag!r} has no inline env (inline tasks: "
                               f"{', '.join(sorted(self._factories))})")
            try:
                env = self._factories[tag](**self._specs[tag][1].model_dump())
            except Exception as exc:
                raise InlineEnvCallError(f"constructing the env raised {_text(exc)}") from exc
            with self._lock:
                self.constructions[tag] = self.constructions.get(tag, 0) + 1
                late = env_id in self._closed_unbuilt  # env ids are never reused
                if late:
                    del self._closed_unbuilt[env_id]
                else:
                    self._envs[env_id] = env
            if late:
                error = self._close_env(env)
                with self._lock:
                    self.closed_late += 1
                raise InlineEnvCallError(
                    f"env {env_id!r} was closed while its first reset ran (given up at its "
                    "timeout); the env it built was closed"
                    + (f" ({error})" if error else ""))
        try:
            obs, info = env.reset(seed=seed)
            text = text_observation(obs, "reset")
        except Exception as exc:
            raise InlineEnvCallError(_text(exc)) from exc
        return text, _plain(info)

    def step(self, env_id: str, action: str,
             timeout_s: float = 30.0) -> tuple[str, float, bool, bool, dict[str, Any]]:
        from rollart_sdk.cluster.roles import _plain, text_observation

        env = self._envs.get(env_id)
        if env is None:
            raise KeyError(f"no env {env_id!r} inline (never reset, or closed)")
        try:
            obs, reward, term, trunc, info = env.step(action)
            text = text_observation(obs, "step")
        except Exception as exc:
            raise InlineEnvCallError(_text(exc)) from exc
        return text, float(reward), bool(term), bool(trunc), _plain(info)

    def close(self, env_id: str) -> str | None:
        """Close the env; returns the close error's text, if any (never raises)."""
        with self._lock:
            env = self._envs.pop(env_id, None)
            if env is None:  # never built, or its first reset is still running
                self._closed_unbuilt[env_id] = None
                while len(self._closed_unbuilt) > _MAX_CLOSED_UNBUILT:
                    del self._closed_unbuilt[next(iter(self._closed_unbuilt))]
                return None
        error = self._close_env(env)
        if error is None:
            with self._lock:
                self.closed += 1
        return error

    @staticmethod
    def _close_env(env: Any) -> str | None:
        close = getattr(env, "close", None)
        if callable(close):
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - reported to the caller, who logs it
                return f"env close raised {_text(exc)}"
        return None

    def count(self) -> int:
        return len(self._envs)

    def stats(self) -> dict[str, Any]:
        return {"name": self.name, "live": len(self._envs),
                "constructions": dict(self.constructions), "killed": self.killed,
                "closed": self.closed, "closed_late": self.closed_late}

    def shutdown(self) -> None:
        for env_id in list(self._envs):
            self.close(env_id)


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
                fut.set_exception(InlineEnvCallError(
                    f"{self.name}: could not start a thread for the env call: {_text(exc)}"))
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
    (:class:`InlineEnvHung`; its thread runs on, counted ``hung`` until the env returns),
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
        """Raise :class:`InlineEnvCallError` (the reason, the fix) while too many calls hang."""
        hung = self._hung(now)
        if len(hung) < self.max_hung:
            return
        self.refused += 1
        tags = sorted({tag for tag, *_ in hung})
        kinds = Counter(method for _, method, *_ in hung)
        over = max(now - deadline for *_, deadline in hung)
        raise InlineEnvCallError(
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
            raise InlineEnvHung(
                f"EnvHung: no {method} within {timeout_s}s from the env of task {tag!r} "
                "(env_host: thread: its thread runs on, it cannot be killed)") from None

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
        except InlineEnvHung:
            return (f"env close did not return within {CLOSE_TIMEOUT_S:g}s (env_host: "
                    "thread: its thread runs on, it cannot be killed)")
        except InlineEnvCallError as exc:
            return str(exc)
        return out

    def count(self) -> int:
        return self.local.count()

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


def inline_tasks(cfg: Any, described: dict[str, dict[str, Any]]) -> set[str]:
    """The tags whose envs live inline: ``env_host: inline``, or ``auto`` with an env that
    declares ``step_cost = "cheap"`` and no injected faults."""
    out = set()
    for task in cfg.tasks:
        if task.env_host == "thread":
            continue
        faults = task.env.faults is not None and task.env.faults.active
        if task.env_host == "inline" or (
            task.env_host == "auto" and not faults
            and described[task.tag].get("step_cost") == "cheap"
        ):
            out.add(task.tag)
    return out


def thread_tasks(cfg: Any) -> set[str]:
    """The tags whose envs live in this process, called on its thread pool."""
    return {task.tag for task in cfg.tasks if task.env_host == "thread"}


def inline_handle(envs: dict[str, tuple[Any, ...]], on_loop: bool = True) -> Any:
    """A handle on envs built in this process: called directly on the caller's event loop
    (``on_loop``), or each call on a thread of the host's own (:class:`ThreadEnvWorker`)."""
    from rollart_sdk.cluster.handles import WorkerHandle

    if on_loop:
        return WorkerHandle(INLINE_NAME, InlineEnvWorker(envs, INLINE_NAME), pool="control",
                            hardware="cpu", is_ray=False, inline=True)
    # Its reset/step/close are coroutines: the handle awaits them on the loop.
    return WorkerHandle(THREAD_NAME, ThreadEnvWorker(envs, THREAD_NAME), pool="control",
                        hardware="cpu", is_ray=False)
