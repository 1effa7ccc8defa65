"""Cheap environments hosted inline: in the EnvManagers' own process, no hop per call.

An env whose ``reset``/``step`` take microseconds (FrozenLake, a text puzzle) costs far
more in transport than in work when every call is a Ray round trip or a pipe to its own
process (issue 12 measured 89 ms per reset and 15 ms per step through Ray against
microseconds of work). ``tasks[].env_host: inline`` (or ``auto`` with an env class that
declares ``step_cost = "cheap"``) builds such a task's envs here, and the
:class:`~rollart_sdk.control.handles.WorkerHandle` calls them directly on the event loop.

What inline gives up, and why it is opt-in: the env shares the control plane's process.
A hung ``step`` cannot be killed (it would stall every trajectory), a crash of the env's
native code ends the run, and an env that sleeps blocks the loop. Heavy, slow or unsafe
envs keep ``env_host: worker`` (each env in its own killable process on the env role's
workers). Injected faults (``tasks[].env.faults``) need a worker host; the config says so.
"""

from __future__ import annotations

from typing import Any

INLINE_NAME = "env-inline"


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class InlineEnvCallError(RuntimeError):
    """The env raised (the text is the env's ``Type: message``, as a worker host sends)."""


class InlineEnvWorker:
    """The env role's interface (``reset``/``step``/``close``/``count``/``stats``/
    ``shutdown``) over envs built in this process. ``envs``: tag -> (descriptor, options)."""

    role = "environment"

    def __init__(self, envs: dict[str, tuple[Any, ...]]) -> None:
        self.name = INLINE_NAME
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
        env = self._envs.pop(env_id, None)
        if env is None:
            return None
        close = getattr(env, "close", None)
        if callable(close):
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - reported to the caller, who logs it
                return f"env close raised {_text(exc)}"
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
        faults = task.env.faults is not None and task.env.faults.active
        if task.env_host == "inline" or (
            task.env_host == "auto" and not faults
            and described[task.tag].get("step_cost") == "cheap"
        ):
            out.add(task.tag)
    return out


def inline_handle(envs: dict[str, tuple[Any, ...]]) -> Any:
    """A handle whose calls run the inline envs directly on the caller's event loop."""
    from rollart_sdk.control.handles import WorkerHandle

    return WorkerHandle(INLINE_NAME, InlineEnvWorker(envs), pool="control", hardware="cpu",
                        is_ray=False, inline=True)
