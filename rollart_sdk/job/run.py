"""``run_job``: run a built job's pipeline with a live display; whatever ends it (done,
Ctrl-C, SIGTERM, an error), the final checkpoint and ``summary.json`` are written."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from rollart_sdk.job import resume, summary
from rollart_sdk.job.run_dir import final_checkpoint
from rollart_sdk.job.signals import SigtermStop, quiet_cancellations

if TYPE_CHECKING:
    from rollart_sdk.control.pipeline import StepRecord
    from rollart_sdk.job.build import Job


def run_job(job: Job, steps: int, progress: bool = True) -> list[StepRecord]:
    """Run the pipeline with a live display; a final checkpoint even on Ctrl-C."""
    from rollart_sdk.control.progress import ProgressDisplay

    display = ProgressDisplay(job.config, steps, enabled=progress)
    job.reports.show(display, steps)  # the pipeline reports each step through it
    interrupted = False
    error: Exception | None = None
    with display, SigtermStop() as stop:
        try:
            asyncio.run(_main(job, steps, stop))
        except (KeyboardInterrupt, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError) and not stop.signals:
                raise  # not our SIGTERM: a cancellation we did not ask for
            interrupted = True
        except Exception as exc:  # noqa: BLE001 - re-raised after the final checkpoint
            error = exc
    job.signal = stop.received or ("SIGINT" if interrupted else None)
    if job.resume is not None and not job.restored:
        resume.end_unrestored(job, interrupted, error)

    save_errors = [*job.pipeline.checkpoint_errors, *final_checkpoint(job)]
    written = summary.write_summary(job, summary.collect(job, interrupted, error, save_errors))
    job.run_dir.close()
    error = error or (written if not interrupted else None)
    if interrupted:
        raise KeyboardInterrupt
    if error is not None:
        raise error
    return job.pipeline.records


async def _main(job: Job, steps: int, stop: SigtermStop) -> None:
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    # Blocking calls of in-process workers (env steps, engine steps) run on the loop's
    # default executor: give it room for every concurrent environment.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=job.pipeline.scheduler.max_running
                                                 + 16))
    stop.watch()
    loop.set_exception_handler(quiet_cancellations)
    if job.resume is not None:
        await resume.restore(job)
    await job.pipeline.run(steps)
