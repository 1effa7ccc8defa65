"""The run's one SIGTERM path (:class:`SigtermStop`) and the loop's quiet handling of the
cancellations a stop leaves behind (:func:`quiet_cancellations`).

SIGTERM (Kubernetes, Slurm, docker stop, systemd) ends a run like Ctrl-C: the final
checkpoint, ``summary.json`` and flushed logs are written, and ``rollart train`` exits
143. While the control plane's loop runs, the signal cancels the loop's main task, so the
stop lands at an await and every cleanup runs in order (a KeyboardInterrupt raised from a
signal handler lands between any two bytecodes, e.g. between a trajectory's finish and its
count: CI once lost 3 trajectories so). Before the loop starts and after it ends, it
raises KeyboardInterrupt, as Ctrl-C does.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from types import FrameType
from typing import Any


class SigtermStop:
    """``with SigtermStop() as stop:`` around the run: SIGTERM is recorded in
    ``stop.signals`` and stops the run; ``stop.watch()``, called first in the loop's
    main task, makes it cancel that task instead of raising. Outside the main thread
    (where no signal handler can be set) it records nothing and changes nothing."""

    def __init__(self) -> None:
        self.signals: list[str] = []
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> SigtermStop:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._outside_loop)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    @property
    def received(self) -> str | None:
        """The first signal that stopped the run, if any."""
        return self.signals[0] if self.signals else None

    def watch(self) -> None:
        """From now until the current task ends, SIGTERM cancels it (the loop's own
        signal handler, woken through its self-pipe); then the handler outside the loop
        is back, for the loop's shutdown and what follows."""
        task = asyncio.current_task()
        if not self._installed or task is None:
            return
        loop = asyncio.get_running_loop()

        def in_loop() -> None:
            self.signals.append("SIGTERM")
            task.cancel()

        def done(_: object) -> None:
            # The loop would restore SIG_DFL when it closes: ours goes back first.
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._outside_loop)

        loop.add_signal_handler(signal.SIGTERM, in_loop)
        task.add_done_callback(done)

    def _outside_loop(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append("SIGTERM")
        raise KeyboardInterrupt


def quiet_cancellations(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's error handler: a cancellation is how a stop ends the calls in flight,
    not an error. When the run stops, the calls still running (a gather of worker calls
    whose task is cancelled with them) end cancelled, and asyncio's default handler
    would print each as "_GatheringFuture exception was never retrieved" with a
    traceback. Everything else goes to the default handler."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)
