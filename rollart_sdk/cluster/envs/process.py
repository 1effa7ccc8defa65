"""``env_host: worker``: each environment in its own process, so that a hung env can be killed.

A thread blocked in a hung ``reset`` or ``step`` cannot be stopped, and a Ray actor task
cannot be cancelled from the caller's side; a process can be killed. :class:`EnvWorker`
(the environment role's worker) gives every env id an :class:`EnvProcess`: a child process that constructs the env, serves
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
import time
from typing import TYPE_CHECKING, Any

from rollart_sdk.cluster.envs.errors import EnvCallError, EnvHung, EnvProcessDied, error_text
from rollart_sdk.cluster.envs.results import plain_info, text_observation
from rollart_sdk.cluster.worker import EnvironmentWorker, one_thread

if TYPE_CHECKING:
    from rollart_sdk.cluster.hosts import EnvHost

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
        ctx.set_forkserver_preload(["rollart_sdk.cluster.envs.process", *sorted(_preloaded)])
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


# close(): how long an env busy in a call is waited for before its process is killed.
BUSY_CLOSE_WAIT_S = 0.25


class EnvProcess:
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
        """Ask the env to close (in its process), then let the process end. An env still
        inside a call after ``BUSY_CLOSE_WAIT_S`` (a run stopping while a step runs on) is
        killed instead: its close would wait for that call."""
        if not self.alive:
            return
        deadline = time.monotonic() + BUSY_CLOSE_WAIT_S
        while self._lock.locked() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self._lock.locked():
            self.kill()  # the call in flight sees its pipe close and ends
            raise EnvHung(f"env {self.env_id} was inside a call at close; its process was killed")
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
        self._free: dict[str, list[EnvProcess]] = {}
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

    def take(self, module: str) -> EnvProcess:
        with self._lock:
            free = self._free.setdefault(module, [])
            host = free.pop() if free else None
            if self._thread is None and self.spares:
                self._thread = threading.Thread(target=self._fill, daemon=True, name="env-spares")
                self._thread.start()
        self._want.set()
        return host if host is not None else EnvProcess(module)

    def _fill(self) -> None:
        while not self._closed:
            self._want.wait(1.0)
            self._want.clear()
            for module in list(self._free):
                while not self._closed and len(self._free[module]) < self.spares:
                    host = EnvProcess(module)
                    with self._lock:
                        self._free[module].append(host)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            hosts = [h for free in self._free.values() for h in free]
            self._free.clear()
        for h in hosts:
            h.kill()


class EnvWorker(EnvironmentWorker):
    """Environment: hosts many environments of any tasks, each addressed by ``env_id``.

    Every env runs in its own process (:class:`EnvProcess`):
    a call that outlives its ``timeout_s`` kills that process and raises ``EnvHung``, so a
    hung env holds neither a thread nor a slot. The actor is threaded (``max_concurrency``)
    so that a slow ``reset`` or ``step`` of one environment never blocks the others (R2).
    ``envs``: tag -> (descriptor, options, faults or None).
    """

    def __init__(self, envs: dict[str, tuple[Any, ...]]) -> None:
        one_thread()
        self.name = self.worker_name
        self._specs = envs
        self._hosts: dict[str, EnvProcess] = {}
        self._factories: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.killed = 0  # envs whose call hung: their process was killed
        self.closed = 0  # envs closed by their own close()
        self._pool = HostPool(spares=4)
        for tag, spec in envs.items():  # start the env processes' server and spares now
            self._factories[tag] = spec[0].load()
            self._pool.warm(self._factories[tag].__module__)
        self.constructions: dict[str, int] = {}  # tag -> instances built (pooling: once each)

    def _host(self, env_id: str, tag: str) -> EnvProcess:
        with self._lock:
            host = self._hosts.get(env_id)
            if host is not None:
                return host
            if tag not in self._factories:
                self._factories[tag] = self._specs[tag][0].load()
            factory = self._factories[tag]
        spec = self._specs[tag]
        faults = spec[2] if len(spec) > 2 else None
        host = self._pool.take(factory.__module__)
        host.assign(factory, spec[1].model_dump(), faults, env_id)
        with self._lock:
            self._hosts[env_id] = host
            self.constructions[tag] = self.constructions.get(tag, 0) + 1
        return host

    def _call(self, env_id: str, host: EnvProcess, method: str, args: tuple[Any, ...],
              timeout_s: float) -> Any:
        try:
            return host.call(method, args, timeout_s)
        except EnvHung:
            with self._lock:
                self.killed += 1
                self._hosts.pop(env_id, None)
            raise

    def reset(self, env_id: str, tag: str, seed: int,
              timeout_s: float = 30.0) -> tuple[str, dict[str, Any]]:
        return self._call(env_id, self._host(env_id, tag), "reset", (seed,), timeout_s)

    def step(self, env_id: str, action: str,
             timeout_s: float = 30.0) -> tuple[str, float, bool, bool, dict[str, Any]]:
        host = self._hosts.get(env_id)
        if host is None:
            raise KeyError(f"no env {env_id!r} on {self.name} (never reset, or killed)")
        return self._call(env_id, host, "step", (action,), timeout_s)

    def close(self, env_id: str) -> str | None:
        """Close the env in its process; returns the close error's text, if any."""
        with self._lock:
            host = self._hosts.pop(env_id, None)
        if host is None:
            return None
        try:
            host.close()
        except (EnvCallError, EnvHung, EnvProcessDied) as exc:
            return str(exc)
        with self._lock:
            self.closed += 1
        return None

    def stats(self) -> dict[str, Any]:
        """Live instances, how many were built per task, killed (hung) and closed."""
        return {"name": self.name, "live": len(self._hosts),
                "constructions": dict(self.constructions), "killed": self.killed,
                "closed": self.closed}

    def shutdown(self) -> None:
        for env_id in list(self._hosts):
            self.close(env_id)
        self._pool.close()


def _serve(conn: Any) -> None:
    """Child process body: wait for the env, build it, answer calls, close it exactly once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when an env ends

    env: Any = None
    error: str | None = None
    try:
        kind, (factory, options, faults, env_id) = conn.recv()
    except (EOFError, OSError):
        return  # a spare that was never used
    try:
        env = factory(**options)
        if faults is not None and faults.active:
            from rollart_sdk.cluster.envs.faults import FaultyEnv

            env = FaultyEnv(env, faults, env_id)
    except Exception as exc:  # noqa: BLE001 - sent to the caller as the reset's error
        error = f"constructing the env raised {error_text(exc)}"
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
                if not _reply(conn, (False, error or "the env is closed")):
                    return
                continue
            if not _reply(conn, _call(env, method, args)):
                return  # the parent is gone (killed): the finally closes the env
    finally:
        if env is not None:
            _close(env, None)


def _call(env: Any, method: str, args: Any) -> tuple[bool, Any]:
    """``(True, result)`` of a reset or step, or ``(False, its error)``."""
    try:
        if method == "reset":
            obs, info = env.reset(seed=args[0])
            return True, (text_observation(obs, "reset"), plain_info(info))
        if method == "step":
            obs, reward, term, trunc, info = env.step(args[0])
            return True, (text_observation(obs, "step"), float(reward), bool(term),
                          bool(trunc), plain_info(info))
        raise AttributeError(f"env hosts serve reset/step/close, not {method!r}")
    except Exception as exc:  # noqa: BLE001 - the env's error goes to the caller
        return False, error_text(exc)


def _reply(conn: Any, answer: tuple[bool, Any]) -> bool:
    """Send ``answer`` to the parent; False when it is gone (a killed driver: its env
    processes end quietly, not with a traceback each on the user's terminal)."""
    try:
        conn.send(answer)
    except (BrokenPipeError, EOFError, ConnectionResetError):
        return False
    return True


def _close(env: Any, conn: Any) -> None:
    ok, text = True, None
    if env is not None:
        try:
            close = getattr(env, "close", None)
            if callable(close):
                close()
        except Exception as exc:  # noqa: BLE001 - reported to the caller, who logs it
            ok, text = False, f"env close raised {error_text(exc)}"
    if conn is not None:
        try:
            conn.send((ok, text))
        except OSError:
            pass  # the parent stopped listening; nothing is left to tell


if TYPE_CHECKING:  # mypy checks the host against the env role's Protocol
    _conforms: type[EnvHost] = EnvWorker
