"""One environment in its own process, so that a hung env can be killed.

A thread blocked in a hung ``reset`` or ``step`` cannot be stopped, and a Ray actor task
cannot be cancelled from the caller's side; a process can be killed. ``EnvWorker`` gives
every env id an :class:`EnvHost`: a child process that constructs the env, serves
``reset``/``step`` over a pipe and closes the env exactly once, on ``close`` or when its
parent goes away. The child is forked by a forkserver that has the env's module
imported (a few ms), and only runs the env and the pipe loop. A call that outlives
its timeout kills the process (the env is then not closed: its process is gone) and
raises :class:`EnvHung`; the caller's slot is free at once.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
from typing import Any

_MAX_ERROR = 2000  # characters of an env's exception text sent back


class EnvHung(TimeoutError):
    """An env call outlived its timeout; the env's process was killed."""


class EnvCallError(RuntimeError):
    """The env raised (the text is the env's ``Type: message``)."""


class EnvProcessDied(RuntimeError):
    """The env's process exited during a call (a crash of the env or of Python)."""


_start_lock = threading.Lock()
_preloaded: set[str] = set()


def _context(module: str) -> Any:
    """A forkserver context: a small server process (``module`` imported) forks each env
    process in a few ms. Forking the caller itself would make every page the caller then
    writes a copy while envs live (slow for a process running an engine in-process)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    if module not in _preloaded:
        _preloaded.add(module)
        ctx.set_forkserver_preload(["rollart_sdk.cluster.env_host", *sorted(_preloaded)])
    return ctx


def _start(proc: Any) -> None:
    """Start ``proc`` without making the child re-run the parent's ``__main__`` (a Ray
    worker's entry script: seconds per env); everything the child needs is importable."""
    main = sys.modules.get("__main__")
    with _start_lock:
        if main is None:
            proc.start()
            return
        saved: dict[str, Any] = {k: main.__dict__[k] for k in ("__file__", "__spec__")
                                 if k in main.__dict__}
        try:
            main.__dict__.pop("__file__", None)
            main.__spec__ = None
            proc.start()
        finally:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


class EnvHost:
    """A child process hosting one env. ``call`` is thread-safe (one call at a time).

    The process starts empty and waits for its env (``assign``), so that a pool can keep
    spare processes started ahead of the resets that need them."""

    def __init__(self, module: str) -> None:
        ctx = _context(module)
        self.module = module
        self.env_id = "(spare)"
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="env-host")
        _start(self._proc)
        child.close()
        self._lock = threading.Lock()
        self.alive = True

    def assign(self, factory: Any, options: dict[str, Any], faults: Any, env_id: str) -> None:
        """Give the process its env (built there; a construction error answers the reset)."""
        self.env_id = env_id
        self._conn.send(("init", (factory, options, faults, env_id)))

    def call(self, method: str, args: tuple[Any, ...], timeout: float) -> Any:
        with self._lock:
            if not self.alive:
                raise EnvProcessDied(f"env {self.env_id} was killed earlier")
            try:
                self._conn.send((method, args))
                answered = self._conn.poll(timeout)
                if answered:
                    ok, value = self._conn.recv()
            except (EOFError, OSError) as exc:
                code = self._proc.exitcode
                self.kill()
                raise EnvProcessDied(
                    f"the env process exited during {method} (exit code {code}): {exc}"
                ) from None
            if not answered:
                self.kill()
                raise EnvHung(f"env {method} outlived {timeout:g}s; its process was killed")
        if not ok:
            raise EnvCallError(value)
        return value

    def close(self, timeout: float = 10.0) -> None:
        """Ask the env to close (in its process), then let the process end."""
        if not self.alive:
            return
        try:
            self.call("close", (), timeout)
        except BaseException:
            self.kill()
            raise
        # The env closed; its process is ending by itself (its server reaps it).
        self.alive = False
        self._conn.close()

    def kill(self) -> None:
        if not self.alive:
            return
        self.alive = False
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(5)
        self._conn.close()


class HostPool:
    """Spare env processes started ahead of the resets that take them (a process start is
    off the reset's path); a background thread keeps ``spares`` of them per env module."""

    def __init__(self, spares: int = 4) -> None:
        self.spares = spares
        self._free: dict[str, list[EnvHost]] = {}
        self._lock = threading.Lock()
        self._want = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def warm(self, module: str) -> None:
        """Start the spares of ``module`` now (the first resets do not wait for them)."""
        with self._lock:
            self._free.setdefault(module, [])
            if self._thread is None and self.spares:
                self._thread = threading.Thread(target=self._fill, daemon=True, name="env-spares")
                self._thread.start()
        self._want.set()

    def take(self, module: str) -> EnvHost:
        with self._lock:
            free = self._free.setdefault(module, [])
            host = free.pop() if free else None
            if self._thread is None and self.spares:
                self._thread = threading.Thread(target=self._fill, daemon=True, name="env-spares")
                self._thread.start()
        self._want.set()
        return host if host is not None else EnvHost(module)

    def _fill(self) -> None:
        while not self._closed:
            self._want.wait(1.0)
            self._want.clear()
            for module in list(self._free):
                while not self._closed and len(self._free[module]) < self.spares:
                    host = EnvHost(module)
                    with self._lock:
                        self._free[module].append(host)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            hosts = [h for free in self._free.values() for h in free]
            self._free.clear()
        for h in hosts:
            h.kill()


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_MAX_ERROR]


def _serve(conn: Any) -> None:
    """Child process body: wait for the env, build it, answer calls, close it exactly once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when an env ends
    from rollart_sdk.cluster.roles import _plain, text_observation

    env: Any = None
    error: str | None = None
    try:
        kind, (factory, options, faults, env_id) = conn.recv()
    except (EOFError, OSError):
        return  # a spare that was never used
    try:
        env = factory(**options)
        if faults is not None and faults.active:
            from rollart_sdk.faults import FaultyEnv

            env = FaultyEnv(env, faults, env_id)
    except Exception as exc:  # noqa: BLE001 - sent to the caller as the reset's error
        error = f"constructing the env raised {_text(exc)}"
    try:
        while True:
            try:
                method, args = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone: the finally closes the env
            if method == "close":
                e, env = env, None
                _close(e, conn)
                return
            if env is None:
                conn.send((False, error or "the env is closed"))
                continue
            try:
                if method == "reset":
                    obs, info = env.reset(seed=args[0])
                    result: Any = (text_observation(obs, "reset"), _plain(info))
                elif method == "step":
                    obs, reward, term, trunc, info = env.step(args[0])
                    result = (text_observation(obs, "step"), float(reward), bool(term),
                              bool(trunc), _plain(info))
                else:
                    raise AttributeError(f"env hosts serve reset/step/close, not {method!r}")
            except Exception as exc:  # noqa: BLE001 - the env's error goes to the caller
                conn.send((False, _text(exc)))
                continue
            conn.send((True, result))
    finally:
        if env is not None:
            _close(env, None)


def _close(env: Any, conn: Any) -> None:
    ok, text = True, None
    if env is not None:
        try:
            close = getattr(env, "close", None)
            if callable(close):
                close()
        except Exception as exc:  # noqa: BLE001 - reported to the caller, who logs it
            ok, text = False, f"env close raised {_text(exc)}"
    if conn is not None:
        try:
            conn.send((ok, text))
        except OSError:
            pass  # the parent stopped listening; nothing is left to tell
