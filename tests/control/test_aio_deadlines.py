"""``control.aio.wait_for``: the deadlines of every pending call share one loop timer (no
timer, task or future per call), finished calls leave their queue at once, and a
deadline expires exactly when ``asyncio.wait_for``'s would (virtual clock: no timing)."""

from __future__ import annotations

import asyncio

import pytest

from rollart_sdk.control.aio import deadlines, wait_for
from rollart_sdk.sim.clock import run_virtual

N = 500


def _timers(loop: asyncio.AbstractEventLoop) -> int:
    return sum(1 for h in loop._scheduled if not h.cancelled())  # type: ignore[attr-defined]


async def _answer(fut: asyncio.Future[int]) -> int:
    return await fut  # a call's coroutine (as the env and engine clients' are)


async def _pending_calls(wait) -> dict[str, int]:
    """``N`` calls waiting at once through ``wait``: the loop's live timers and tasks."""
    loop = asyncio.get_running_loop()
    futs = [loop.create_future() for _ in range(N)]
    tasks = [asyncio.create_task(wait(_answer(f))) for f in futs]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    seen = {"timers": _timers(loop), "tasks": len(asyncio.all_tasks()) - 1}
    for i, f in enumerate(futs):
        f.set_result(i)
    assert await asyncio.gather(*tasks) == list(range(N))
    return seen


def test_pending_calls_share_one_timer_and_add_no_task():
    # asyncio.wait_for: a timer and a task per call (what the loop's heap held per call)
    plain = asyncio.run(_pending_calls(lambda f: asyncio.wait_for(f, 60)))
    assert plain == {"timers": N, "tasks": 2 * N}
    # the helper: one timer for all of them, no task of its own
    assert asyncio.run(_pending_calls(lambda f: wait_for(f, 60))) == {"timers": 1, "tasks": N}


def test_finished_calls_leave_their_queue_and_the_timer_goes_with_the_last():
    async def main():
        loop = asyncio.get_running_loop()
        table = deadlines(loop)
        futs = [loop.create_future() for _ in range(N)]
        tasks = [asyncio.create_task(wait_for(f, 30 + i % 3)) for i, f in enumerate(futs)]
        await asyncio.sleep(0)
        counts = [len(table), len(table.queues)]
        for f in futs[:-1]:
            f.set_result(None)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        counts += [len(table), table.timer is not None]
        futs[-1].set_result(None)
        await asyncio.gather(*tasks)
        return counts + [len(table), table.timer is None]

    # three timeouts: three queues; one call left keeps the timer; none: no timer
    assert asyncio.run(main()) == [N, 3, 1, True, 0, True]


def test_deadlines_expire_exactly_in_order_on_the_virtual_clock():
    async def call(start: float, timeout: float, takes: float, log: list) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(start)
        try:
            got = await wait_for(asyncio.sleep(takes, result="done"), timeout)
            log.append((start, timeout, got, loop.time()))
        except TimeoutError:
            log.append((start, timeout, "timeout", loop.time()))

    async def main():
        log: list = []
        await asyncio.gather(
            call(0, 5, 1, log),    # finishes at 1: the timer set for 5 only re-arms there
            call(2, 5, 99, log),   # same timeout, later start: expires at 7
            call(1, 2, 99, log),   # a shorter timeout started later expires first (3)
            call(3, 5, 4.5, log),  # finishes before its deadline (8)
            call(4, 0.5, 99, log),
        )
        return log

    log, _ = run_virtual(main())
    assert log == [(0, 5, "done", 1.0), (1, 2, "timeout", 3.0), (4, 0.5, "timeout", 4.5),
                   (2, 5, "timeout", 7.0), (3, 5, "done", 7.5)]


def test_nested_deadlines_the_earlier_one_wins():
    async def main():
        loop = asyncio.get_running_loop()
        inner_cancelled = []

        async def inner(timeout: float) -> str:
            try:
                return await wait_for(asyncio.sleep(99, result="inner"), timeout)
            except asyncio.CancelledError:
                inner_cancelled.append(loop.time())
                raise

        out = []
        for outer_t, inner_t in ((2, 5), (5, 1)):
            t0 = loop.time()
            try:
                await wait_for(inner(inner_t), outer_t)
            except TimeoutError:
                out.append(loop.time() - t0)
        return out, inner_cancelled, len(deadlines(loop))

    (out, inner_cancelled, left), _ = run_virtual(main())
    # the outer's 2 s expires first (the inner call cancelled at 2); then the inner's 1 s
    assert out == [2.0, 1.0] and inner_cancelled == [2.0] and left == 0


def test_a_cancel_from_outside_is_a_cancel_not_a_timeout():
    async def main():
        task = asyncio.create_task(wait_for(asyncio.sleep(99), 10))
        await asyncio.sleep(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return len(deadlines(asyncio.get_running_loop())), task.cancelling()

    (left, cancelling), _ = run_virtual(main())
    assert left == 0 and cancelling == 1


def test_an_awaitable_that_swallows_the_timeout_returns_its_result():
    # as asyncio.wait_for: the call's own result stands, the task is not left cancelling
    async def stubborn() -> str:
        try:
            await asyncio.sleep(99)
        except asyncio.CancelledError:
            await asyncio.sleep(1)
        return "kept"

    async def main():
        got = await wait_for(stubborn(), 2)
        task = asyncio.current_task()
        assert task is not None
        return got, asyncio.get_running_loop().time(), task.cancelling()

    (got, at, cancelling), _ = run_virtual(main())
    assert (got, at, cancelling) == ("kept", 3.0, 0)


def test_zero_or_no_timeout_behaves_as_asyncio_wait_for():
    async def main():
        with pytest.raises(TimeoutError):
            await wait_for(asyncio.sleep(1), 0)
        return await wait_for(asyncio.sleep(1, result="x"), None)

    assert run_virtual(main())[0] == "x"


def test_the_table_goes_with_its_loop():
    import gc
    import weakref

    loop = asyncio.new_event_loop()
    loop.run_until_complete(wait_for(asyncio.sleep(0), 5))
    table = weakref.ref(deadlines(loop))
    loop.close()
    del loop
    gc.collect()
    assert table() is None
