"""Moved to :mod:`rollart_sdk.cluster.envs` (``inline``, ``thread``, ``hosting``,
``errors``); this path re-exports the names for one release (CHANGELOG.md).
``InlineEnvCallError`` and ``InlineEnvHung`` are now the env hosts' one
``EnvCallError`` and ``EnvHung``."""

from rollart_sdk.cluster.envs.errors import InlineEnvCallError, InlineEnvHung
from rollart_sdk.cluster.envs.hosting import inline_handle, inline_tasks, thread_tasks
from rollart_sdk.cluster.envs.inline import INLINE_NAME, InlineEnvWorker
from rollart_sdk.cluster.envs.thread import (
    CLOSE_TIMEOUT_S,
    MAX_HUNG_CALLS,
    THREAD_NAME,
    ThreadEnvWorker,
)

__all__ = ["CLOSE_TIMEOUT_S", "INLINE_NAME", "MAX_HUNG_CALLS", "THREAD_NAME",
           "InlineEnvCallError", "InlineEnvHung", "InlineEnvWorker", "ThreadEnvWorker",
           "inline_handle", "inline_tasks", "thread_tasks"]
