"""``env_host: inline``: cheap environments in the EnvManagers' own process, no hop per call.

An env whose ``reset``/``step`` take microseconds (FrozenLake, a text puzzle) costs far
more in transport than in work when every call is a Ray round trip or a pipe to its own
process (issue 12 measured 89 ms per reset and 15 ms per step through Ray against
microseconds of work). ``tasks[].env_host: inline`` (or ``auto`` with an env class that
declares ``step_cost = "cheap"``) builds such a task's envs here, and the
:class:`~rollart_sdk.cluster.handles.WorkerHandle` calls them directly on the event loop.
``env_host: thread`` (:mod:`rollart_sdk.cluster.envs.thread`) builds them here too but
runs each call on a thread of its own.

What inline gives up, and why it is opt-in: the env shares the control plane's process.
A hung ``step`` cannot be killed (it would stall every trajectory), a crash of the env's
native code ends the run, and an env that sleeps blocks the loop. Heavy, slow or unsafe
envs keep ``env_host: worker`` (each env in its own killable process on the env role's
workers, :mod:`rollart_sdk.cluster.envs.process`). Injected faults (``tasks[].env.faults``)
need a worker host; the config says so.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from rollart_sdk.cluster.envs.errors import EnvCallError, error_text
from rollart_sdk.cluster.envs.results import plain_info, text_observation

if TYPE_CHECKING:
    from rollart_sdk.cluster.hosts import EnvHost

INLINE_NAME = "env-inline"
_MAX_CLOSED_UNBUILT = 4096  # env ids remembered as closed before their env was built


class InlineEnvWorker:
    """The env role's interface (:class:`~rollart_sdk.cluster.hosts.EnvHost`: ``reset``/
    ``step``/``close``/``stats``/``shutdown``) over envs built in this process. ``envs``:
    tag -> (descriptor, options)."""

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
        env = self._envs.get(env_id)
        if env is None:
            if tag not in self._factories:
                raise KeyError(f"task {tag!r} has no inline env (inline tasks: "
                               f"{', '.join(sorted(self._factories))})")
            try:
                env = self._factories[tag](**self._specs[tag][1].model_dump())
            except Exception as exc:
                raise EnvCallError(f"constructing the env raised {error_text(exc)}") from exc
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
                raise EnvCallError(
                    f"env {env_id!r} was closed while its first reset ran (given up at its "
                    "timeout); the env it built was closed"
                    + (f" ({error})" if error else ""))
        try:
            obs, info = env.reset(seed=seed)
            text = text_observation(obs, "reset")
        except Exception as exc:
            raise EnvCallError(error_text(exc)) from exc
        return text, plain_info(info)

    def step(self, env_id: str, action: str,
             timeout_s: float = 30.0) -> tuple[str, float, bool, bool, dict[str, Any]]:
        env = self._envs.get(env_id)
        if env is None:
            raise KeyError(f"no env {env_id!r} inline (never reset, or closed)")
        try:
            obs, reward, term, trunc, info = env.step(action)
            text = text_observation(obs, "step")
        except Exception as exc:
            raise EnvCallError(error_text(exc)) from exc
        return text, float(reward), bool(term), bool(trunc), plain_info(info)

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
                return f"env close raised {error_text(exc)}"
        return None

    def stats(self) -> dict[str, Any]:
        return {"name": self.name, "live": len(self._envs),
                "constructions": dict(self.constructions), "killed": self.killed,
                "closed": self.closed, "closed_late": self.closed_late}

    def shutdown(self) -> None:
        for env_id in list(self._envs):
            self.close(env_id)


if TYPE_CHECKING:  # mypy checks the host against the env role's Protocol
    _conforms: type[EnvHost] = InlineEnvWorker
