"""The virtual-time loop: sleeps jump the clock, threads take no virtual time, a loop
that can never continue raises, and the control plane's clocks read virtual time."""

from __future__ import annotations

import asyncio
import importlib
import pathlib
import re
import time

import pytest

from rollart_sdk.sim.clock import CLOCKED_MODULES, SimulationDeadlock, run_virtual


def test_sleeps_advance_virtual_time_not_wall_time():
    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def nap(d):
            await asyncio.sleep(d)
            return loop.time() - t0

        return await asyncio.gather(nap(3600), nap(10), nap(0.5))

    for name in CLOCKED_MODULES:  # their first import is slow, and not what is measured
        importlib.import_module(name)
    wall = time.perf_counter()
    (ends, elapsed) = run_virtual(main())
    assert ends == [3600, 10, 0.5]
    assert elapsed == pytest.approx(3600)
    assert time.perf_counter() - wall < 5  # an hour of virtual time, no wall-clock sleep


def test_wait_for_times_out_on_the_virtual_clock():
    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100), 7)
        return loop.time() - t0

    assert run_virtual(main())[0] == pytest.approx(7)


def test_thread_work_takes_no_virtual_time_and_timers_wait_for_it():
    def busy():
        time.sleep(0.2)  # real work in a thread
        return 42

    async def main():
        loop = asyncio.get_running_loop()
        timer = asyncio.ensure_future(asyncio.sleep(0.001))
        x = await asyncio.to_thread(busy)
        # The thread's 0.2 wall seconds did not move the clock past the pending timer.
        assert not timer.done() or loop.time() <= 0.001 + 1e-9
        await timer
        return x, loop.time()

    (x, t), _ = run_virtual(main())
    assert x == 42 and t == pytest.approx(0.001)


def test_a_loop_that_can_never_continue_raises():
    async def main():
        await asyncio.Event().wait()  # nobody will set it, no timer, no thread

    with pytest.raises(SimulationDeadlock, match="every task waits"):
        run_virtual(main())


def test_control_plane_clocks_read_virtual_time_and_are_restored():
    pipeline = importlib.import_module("rollart_sdk.control.pipeline")

    async def main():
        await asyncio.sleep(100)
        return pipeline.time.perf_counter(), pipeline.time.time()

    start = time.time()
    (perf, wall), _ = run_virtual(main())
    assert perf == pytest.approx(100)
    assert wall == pytest.approx(start + 100, abs=5)
    assert pipeline.time is time  # the real module again


def test_every_control_module_that_reads_the_clock_is_clocked():
    """A new control-plane module measuring time must be on the virtual clock too."""
    root = pathlib.Path(importlib.import_module("rollart_sdk.control.pipeline").__file__).parent
    users = {f"rollart_sdk.control.{p.stem}" for p in root.glob("*.py")
             if re.search(r"^import time$", p.read_text(), re.M)}
    assert users <= set(CLOCKED_MODULES), users - set(CLOCKED_MODULES)
