"""The run's stop and a train step that returns at the same moment: the batch is counted
once. Python 3.11's asyncio.wait_for returns the result and loses the cancellation when
the awaited call finished in the same loop iteration as the cancel; CI once saw a
SIGTERM'd run count 8 trajectories twice (trained by the step that went on, and again
when the final checkpoint redeemed the batch the stop had counted dropped)."""

from __future__ import annotations

import asyncio
import copy
import sys

import pytest
from test_failures import one_task

from rollart_sdk.cluster.handles import await_answer
from rollart_sdk.config import load_config
from rollart_sdk.control.aio import wait_for
from rollart_sdk.job import build_job


async def _finish_and_cancel_together(wait):
    """``wait(fut)`` in a task; the future's result and the task's cancel land in one loop
    iteration, the cancel first (wait_for's waiter not yet released)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    task = asyncio.create_task(wait(fut))
    await asyncio.sleep(0)  # the task now waits

    def both():
        fut.set_result("trained")  # schedules wait_for's release of its waiter ...
        task.cancel()  # ... which this cancel overtakes

    loop.call_soon(both)
    try:
        return ("returned", await task)
    except asyncio.CancelledError:
        return ("cancelled", None)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's wait_for keeps the cancel")
def test_plain_wait_for_loses_the_cancel_on_3_11():
    # The defect the helper exists for, shown: the cancel is gone, the result returned.
    assert asyncio.run(_finish_and_cancel_together(
        lambda fut: asyncio.wait_for(fut, 10))) == ("returned", "trained")


def test_wait_for_raises_a_cancel_that_arrived_with_the_result():
    assert asyncio.run(_finish_and_cancel_together(
        lambda fut: wait_for(fut, 10))) == ("cancelled", None)


def test_wait_for_in_cleanup_after_an_earlier_cancel_still_returns():
    # A finally block of a cancelled task awaits cleanup calls: a cancel from BEFORE the
    # wait is not this wait's (the run's stop would otherwise fail its own cleanup).
    async def main():
        async def cancelled_then_cleans_up():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                return await wait_for(asyncio.sleep(0, result="closed"), 10)
            return "not cancelled"

        task = asyncio.create_task(cancelled_then_cleans_up())
        await asyncio.sleep(0)
        task.cancel()
        return await task

    assert asyncio.run(main()) == "closed"


def test_wait_for_timeout_is_unchanged():
    with pytest.raises(TimeoutError):
        asyncio.run(wait_for(asyncio.sleep(5), 0.01))


@pytest.mark.timeout(300)
def test_a_stop_that_lands_with_the_train_steps_answer_counts_the_batch_once(tmp_path):
    """The run is cancelled in the very loop iteration its 2nd train step's answer
    arrives (the answer first, then the cancel of the run and of its train task, before
    wait_for wakes); then the final-checkpoint accounting (report_trained at the trainer's
    version) runs as run_job runs it. launched = trained + dropped, each batch once."""
    data = one_task()
    data["rollout"] = {**data["rollout"], "mode": "sync"}
    cfg, lines = load_config(data=copy.deepcopy(data), overrides=[f"output_dir={tmp_path}"])
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    p = job.pipeline
    trainer = p.trainers[0]
    real_call = trainer.call
    calls = {"train_step": 0}

    async def main():
        loop = asyncio.get_running_loop()
        run_task = asyncio.current_task()
        assert run_task is not None

        async def call(method, *args, **kwargs):
            result = await real_call(method, *args, **kwargs)
            if method == "train_step":
                calls["train_step"] += 1
                if calls["train_step"] == 2:
                    train = next(t for t in asyncio.all_tasks()
                                 if t.get_coro().__qualname__ == "Pipeline._train")

                    def cancel():  # after gather has its result, before wait_for wakes;
                        run_task.cancel()  # the run's stop runs first (as under SIGTERM)
                        train.cancel()

                    loop.call_soon(lambda: loop.call_soon(cancel))
            return result

        trainer.call = call  # type: ignore[method-assign]
        await p.run(50)

    try:
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(main())
        trainer.call = real_call  # type: ignore[method-assign]
        version = await_answer(job.trainers[0].trainer.version(), 60)
        assert version == 2  # the trainer did train the second batch ...
        p.report_trained(version)  # ... as run_job's final checkpoint then accounts it
        dropped = sum(p.buffer.dropped.values())
        assert p.buffer.trained == 2 * cfg.rollout.batch_size, (p.buffer.trained, p.buffer.dropped)
        assert p.scheduler.launched == p.buffer.trained + dropped, (
            p.scheduler.launched, p.buffer.trained, dict(p.buffer.dropped))
    finally:
        job.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["sync", "sync-streamed", "async"])
def test_a_stop_that_lands_as_a_batch_is_taken_counts_the_batch(tmp_path, mode):
    """The run is cancelled (as SIGTERM cancels it) after the buffer handed out step 1's
    batch (streamed: its groups, one take at a time) but before the run's task woke to
    read it. The batch is the step's: counted dropped (run_end), never lost. A
    fresh-clone CI run once ended with launched 24 = trained 8 + dropped 8: one batch of 8
    taken out of the buffer and then forgotten."""
    data = one_task()
    data["rollout"] = {**data["rollout"], "mode": mode.removesuffix("-streamed")}
    if mode == "sync-streamed":
        data["train"] = {**data.get("train", {}), "stream_groups": True}
    cfg, lines = load_config(data=copy.deepcopy(data), overrides=[f"output_dir={tmp_path}"])
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    p = job.pipeline
    name = "take_groups" if mode == "sync-streamed" else "get_batch"
    real_get = getattr(p.buffer, name)
    taken: list[int] = []
    per_step = cfg.rollout.batch_size

    async def main():
        loop = asyncio.get_running_loop()
        run_task = asyncio.current_task()
        assert run_task is not None

        async def get(*args, **kwargs):
            batch = await real_get(*args, **kwargs)
            taken.append(len(batch))
            if sum(taken) > per_step:  # a take of the second batch
                # Runs before the get task's own completion wakes the run's task.
                loop.call_soon(run_task.cancel)
            return batch

        setattr(p.buffer, name, get)
        await p.run(50)

    try:
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(main())
        assert sum(taken) > per_step
        assert ("stream_groups:True" in p.log) == (mode == "sync-streamed"), p.log[:3]
        version = await_answer(job.trainers[0].trainer.version(), 60)
        p.report_trained(version)  # as run_job's final checkpoint accounts the steps
        dropped = dict(p.buffer.dropped)
        # what the 2nd batch had taken when the stop landed, untrained
        assert dropped.get("run_end", 0) >= sum(taken) - per_step, dropped
        assert p.scheduler.launched == p.buffer.trained + sum(dropped.values()), (
            p.scheduler.launched, p.buffer.trained, dropped)
    finally:
        job.close()
