"""Each task's env, built once in the driver before any worker starts, for the checks of
:mod:`rollart_sdk.job.preflight`: its facts (action vocabulary, instructions, step cost,
whether it is an agent) and its first observation (seed 0), from one instance, bounded
by the task's ``reset_timeout_s``.

- :func:`probe_envs_checked` / :func:`probe_envs`: every task's :class:`EnvProbe`; an env
  whose constructor raises is a problem at ``tasks.N.env`` saying what raised where
  (:func:`raised`) and what to look at (its options, or where its module must be);
- :func:`first_observations`: the tasks whose env reset here, with a warning for each
  one that did not (its context budget is then not checked);
- :func:`built_first_observations`: the same from envs built for it alone (the
  simulated run's check, :mod:`rollart_sdk.sim.preflight`).
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollart_sdk.config import RunConfig
from rollart_sdk.errors import ConfigError

if TYPE_CHECKING:
    from rollart_sdk.config.resolve import Resolved

log = logging.getLogger(__name__)

Problems = list[tuple[str, str]]


@dataclass
class EnvProbe:
    """One env of a task, built once in this process for the checks: its facts (action
    vocabulary, instructions, step cost, whether it is an agent) and its first
    observation (seed 0), or the exception that kept it from one (a ``TimeoutError`` past
    the task's ``reset_timeout_s``)."""

    facts: dict[str, Any]
    first: Any


def _bounded(work: Any, timeout: float, name: str) -> Any:
    """``work()`` on a daemon thread: its result, the exception it raised, or a
    ``TimeoutError`` when it is still running after ``timeout`` (it goes on alone)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = work()
        except Exception as exc:  # noqa: BLE001 - returned to the caller, who reports it
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True, name=name)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return TimeoutError(f"reset took longer than {timeout:g}s")
    return box.get("error", box.get("result"))


def _close_quietly(env: Any) -> None:
    """Close the env built for the checks; a close that raises does not stop the checks
    (the run's own envs report theirs) but is said, with where it raised."""
    close = getattr(env, "close", None)
    if callable(close):
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - the check's env only
            log.warning("closing the env %s built for the checks raised %s",
                        type(env).__name__, raised(exc))


def _reset_then_close(env: Any) -> Any:
    try:
        return env.reset(seed=0)[0]
    finally:
        _close_quietly(env)


def env_facts(env: Any) -> dict[str, Any]:
    """What the run reads from an env instance: its action vocabulary and instructions,
    its step cost (``cheap``: hosted inline), whether it is an agent."""
    return {
        "action_vocabulary": getattr(env, "action_vocabulary", None),
        "system_prompt": getattr(env, "system_prompt", None),
        "step_cost": getattr(env, "step_cost", None),
        # An AgentEnv (rollart_sdk.gateway): the agent drives, through the gateway.
        "agent": bool(getattr(env, "is_agent", False)),
        "tool_parser": getattr(env, "tool_parser", None) or "hermes",
    }


def probe_env(resolved: Resolved, timeout: float) -> EnvProbe:
    """Build the env once (a constructor that raises raises here), read its facts, then
    reset it (seed 0) and close it on a thread bounded by ``timeout``."""
    env = resolved.descriptor.load()(**resolved.options.model_dump())
    try:
        facts = env_facts(env)
    except BaseException:
        _close_quietly(env)
        raise
    return EnvProbe(facts, _bounded(lambda: _reset_then_close(env), timeout,
                                    "preflight-reset"))


def probe_envs(cfg: RunConfig, envs: dict[str, Any]) -> dict[str, EnvProbe]:
    """Each task's env, built once (:func:`probe_env`, within its ``reset_timeout_s``);
    a constructor that raises is a :class:`ConfigError` naming the task."""
    probes, problems = probe_envs_checked(cfg, envs)
    if problems:
        raise ConfigError(problems)
    return probes


def probe_envs_checked(cfg: RunConfig, envs: dict[str, Any]) -> tuple[dict[str, EnvProbe],
                                                                       Problems]:
    """:func:`probe_envs`, with the tasks whose env could not be built as problems."""
    probes: dict[str, EnvProbe] = {}
    problems: Problems = []
    for i, task in enumerate(cfg.tasks):
        try:
            probes[task.tag] = probe_env(envs[task.tag], task.reset_timeout_s)
        except Exception as exc:  # noqa: BLE001 - a plugin's (or a user's) constructor
            problems.append((f"tasks.{i}.env", _build_failed(envs[task.tag], exc)))
    return probes, problems


def raised(exc: BaseException) -> str:
    """``Type: message (at file:line)``: an exception as one line, with the innermost
    frame it was raised in (none for an import that failed: that frame is importlib's)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<")]  # importlib's frozen frames
    at = (f" (at {frames[-1].filename}:{frames[-1].lineno})"
          if frames and not isinstance(exc, ImportError) else "")
    return f"{type(exc).__name__}: {str(exc)[:300]}{at}"


def _build_failed(resolved: Resolved, exc: BaseException) -> str:
    """What building an env raised, where, and what to look at."""
    name = resolved.descriptor.name
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    hint = (f"; check its options (`rollart envs {name}` lists them)"
            if not isinstance(exc, ImportError) else
            f"; {missing or 'the module'} must be importable by the Python that runs "
            "rollart: your own module, run rollart from the folder that holds it (that "
            "folder is importable) or add the folder to PYTHONPATH; a package, pip "
            "install it")
    return f"building env {name!r} ({resolved.descriptor.plugin}) raised {raised(exc)}{hint}"


def first_observation(env_cls: Any, options: dict[str, Any], timeout: float) -> Any:
    """The env's first observation (seed 0), or an exception; bounded by ``timeout``
    (construction included)."""
    return _bounded(lambda: _reset_then_close(env_cls(**options)), timeout, "preflight-reset")


def first_observations(cfg: RunConfig, firsts: dict[str, Any],
                       warnings: list[str]) -> Iterator[tuple[int, Any, Any]]:
    """``(index, task, first observation)`` of each task whose env reset here (``firsts``:
    tag -> its observation or the exception its reset gave); for one that did not, a
    warning that its context budget is not checked."""
    for i, task in enumerate(cfg.tasks):
        obs = firsts[task.tag]
        if isinstance(obs, BaseException):
            warnings.append(f"tasks.{i}: the env's reset (seed 0) failed here: {raised(obs)}; "
                            "if it fails so on the env workers too, every episode of the "
                            "task is dropped (its context budget is not checked here)")
            continue
        yield i, task, obs


def built_first_observations(cfg: RunConfig, envs: dict[str, Any],
                        warnings: list[str]) -> Iterator[tuple[int, Any, Any]]:
    """:func:`first_observations` of envs built here for it (the simulated run's check,
    which reads no other fact of its envs)."""
    firsts = {task.tag: first_observation(envs[task.tag].descriptor.load(),
                                          envs[task.tag].options.model_dump(),
                                          task.reset_timeout_s) for task in cfg.tasks}
    return first_observations(cfg, firsts, warnings)


def describe_env(resolved: Resolved) -> dict[str, Any]:
    """Build one env in this process to read its facts (:func:`env_facts`); a run reads
    them from :func:`probe_env`, which resets the same instance for the context check."""
    env = resolved.descriptor.load()(**resolved.options.model_dump())
    try:
        return env_facts(env)
    finally:
        _close_quietly(env)
