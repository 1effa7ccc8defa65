"""Cheap environments hosted inline: in the EnvManagers' own process, no hop per call.

An env whose ``reset``/``step`` take microseconds (FrozenLake, a text puzzle) costs far
more in transport than in work when every call is a Ray round trip or a pipe to its own
process (issue 12 measured 89 ms per reset and 15 ms per step through Ray against
microseconds of work). ``tasks[].env_host: inline`` (or ``auto`` with an env class that
declares ``step_cost = "cheap"``) builds such a task's envs here, and the
:class:`~rollart_sdk.control.handles.WorkerHandle` calls them directly on the event loop.
``env_host: thread`` builds them here too but runs each call on a thread of the process's
pool: for envs that wait (a remote API, a sleep) rather than compute - no process per env,
no Ray hop, and the event loop keeps running while they wait. A thread-hosted call that
hangs is abandoned by its EnvManager at the call's timeout (the trajectory is dropped with
the reason); its thread cannot be killed.

What inline gives up, and why it is opt-in: the env shares the control plane's process.
A hung ``step`` cannot be killed (it would stall every trajectory), a crash of the env's
native code ends the run, and an env that sleeps blocks the loop. Heavy, slow or unsafe
envs keep ``env_host: worker`` (each env in its own killable process on the env role's
workers). Injected faults (``tasks[].env.faults``) need a worker host; the config says so.
"""

from __future__ import annotations

import threading
from typing import Any

INLINE_NAME = "env-inline"
THREAD_NAME = "env-thread"


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class InlineEnvCallError(RuntimeError):
    """The env raised (the text is the env's ``Type: message``, as a worker host sends)."""


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
        self.constructions: dict[str, int] = {}
        self.closed = 0
        self.killed = 0  # an inline env cannot be killed; kept for the stats' shape

    def reset(self, env_id: str, tag: str, seed: int,
              timeout_s: float = 30.0) -> tuple[str, dict[str, Any]]:
        """``timeout_s`` is not enforced inline (nothing can stop a call in this process)."""
        from rollart_sdk.cluster.roles import _plain

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
                self._envs[env_id] = env
                self.constructions[tag] = self.constructions.get(tag, 0) + 1
        try:
            obs, info = env.reset(seed=seed)
        except Exception as exc:
            raise InlineEnvCallError(_text(exc)) from exc
        return str(obs), _plain(info)

    def step(self, env_id: str, action: str,
             timeout_s: float = 30.0) -> tuple[str, float, bool, bool, dict[str, Any]]:
        from rollart_sdk.cluster.roles import _plain

        env = self._envs.get(env_id)
        if env is None:
            raise KeyError(f"no env {env_id!r} inline (never reset, or closed)")
        try:
            obs, reward, term, trunc, info = env.step(action)
        except Exception as exc:
            raise InlineEnvCallError(_text(exc)) from exc
        return str(obs), float(reward), bool(term), bool(trunc), _plain(info)

    def close(self, env_id: str) -> str | None:
        """Close the env; returns the close error's text, if any (never raises)."""
        with self._lock:
            env = self._envs.pop(env_id, None)
        if env is None:
            return None
        close = getattr(env, "close", None)
        if callable(close):
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - reported to the caller, who logs it
                return f"env close raised {_text(exc)}"
        with self._lock:
            self.closed += 1
        return None

    def count(self) -> int:
        return len(self._envs)

    def stats(self) -> dict[str, Any]:
        return {"name": self.name, "live": len(self._envs),
                "constructions": dict(self.constructions), "killed": self.killed,
                "closed": self.closed}

    def shutdown(self) -> None:
        for env_id in list(self._envs):
            self.close(env_id)


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
    (``on_loop``), or each call on a thread of the loop's default pool."""
    from rollart_sdk.control.handles import WorkerHandle

    name = INLINE_NAME if on_loop else THREAD_NAME
    return WorkerHandle(name, InlineEnvWorker(envs, name), pool="control", hardware="cpu",
                        is_ray=False, inline=on_loop)
