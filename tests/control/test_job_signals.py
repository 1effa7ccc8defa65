"""The run's one SIGTERM path (rollart_sdk/job/signals.py): while the loop's main task
runs, SIGTERM cancels it at an await; before the loop and after it (the loop's shutdown
and close) it raises KeyboardInterrupt; at no point while it is installed is SIGTERM left
to the default action, which would kill the driver without a checkpoint. The signals are real (sent to
this process), so the handler installed is the one exercised."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from rollart_sdk.job.signals import SigtermStop

pytestmark = pytest.mark.timeout(60)


def _sigterm_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_outside_the_loop_sigterm_raises_keyboard_interrupt_and_is_recorded():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), SigtermStop() as stop:
        _sigterm_self()
        for _ in range(10_000_000):  # the handler runs between two bytecodes
            pass
    assert stop.signals == ["SIGTERM"] and stop.received == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) == before  # the caller's handler is back


def test_inside_the_loop_sigterm_cancels_the_main_task_at_an_await():
    reached: list[str] = []
    handlers: list[object] = []

    async def main(stop: SigtermStop) -> None:
        stop.watch()
        _sigterm_self()
        reached.append("after kill")  # no exception between two bytecodes here
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            reached.append("cancelled at the await")
            raise

    with SigtermStop() as stop:
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(main(stop))
        handlers.append(signal.getsignal(signal.SIGTERM))
    assert reached == ["after kill", "cancelled at the await"]
    assert stop.signals == ["SIGTERM"]
    # After the loop closed: the handler outside the loop again, never SIG_DFL.
    assert handlers[0] not in (signal.SIG_DFL, signal.SIG_IGN, None)
    assert getattr(handlers[0], "__self__", None) is stop


def test_after_the_loop_a_second_sigterm_still_stops_without_killing_the_process():
    async def main(stop: SigtermStop) -> None:
        stop.watch()
        await asyncio.sleep(0)

    with pytest.raises(KeyboardInterrupt), SigtermStop() as stop:
        asyncio.run(main(stop))  # ends normally: no signal yet
        _sigterm_self()  # the loop is closed: once asyncio.run's close restored SIG_DFL
        for _ in range(10_000_000):
            pass
    assert stop.signals == ["SIGTERM"]
