"""asyncio helpers the control plane relies on.

:func:`wait_for` is ``asyncio.wait_for`` without Python 3.11's lost cancellation: there,
when the awaited call finishes in the same loop iteration as the waiting task is
cancelled, ``wait_for`` returns the result and the cancellation is gone (fixed in 3.12,
where ``wait_for`` is ``asyncio.timeout``). The run's stop cancels its train step that
way: a swallowed cancel let the step go on and count its batch as trained after the stop
had already counted it dropped, so a SIGTERM'd run in CI counted 8 trajectories twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(awaitable: Awaitable[T], timeout: float | None) -> T:
    """``asyncio.wait_for(awaitable, timeout)``; a cancellation of the calling task that
    arrives while it waits is raised even when the call finished at the same moment
    (its result is then dropped, as 3.12 drops it)."""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    result = await asyncio.wait_for(awaitable, timeout)
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError
    return result
