"""Where each task's envs live (``tasks[].env_host``): on the environment role's workers
(:mod:`~rollart_sdk.cluster.envs.process`), inline on the event loop
(:mod:`~rollart_sdk.cluster.envs.inline`) or on threads of this process
(:mod:`~rollart_sdk.cluster.envs.thread`)."""

from __future__ import annotations

from typing import Any

from rollart_sdk.cluster.envs.inline import INLINE_NAME, InlineEnvWorker
from rollart_sdk.cluster.envs.thread import THREAD_NAME, ThreadEnvWorker
from rollart_sdk.cluster.handles import WorkerHandle


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


def inline_handle(envs: dict[str, tuple[Any, ...]], on_loop: bool = True) -> WorkerHandle:
    """A handle on envs built in this process: called directly on the caller's event loop
    (``on_loop``), or each call on a thread of the host's own (:class:`ThreadEnvWorker`)."""
    if on_loop:
        return WorkerHandle(INLINE_NAME, InlineEnvWorker(envs, INLINE_NAME), pool="control",
                            hardware="cpu", is_ray=False, inline=True)
    # Its reset/step/close are coroutines: the handle awaits them on the loop.
    return WorkerHandle(THREAD_NAME, ThreadEnvWorker(envs, THREAD_NAME), pool="control",
                        hardware="cpu", is_ray=False)
