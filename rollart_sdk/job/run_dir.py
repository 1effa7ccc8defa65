"""The run directory at the two ends of a run, in the driver: removed when the workers
could not start (:func:`abandon`), and given the final checkpoint and ``final_model/``
whatever ended the run (:func:`final_checkpoint`). The directory's files themselves are
:mod:`rollart_sdk.control.run_dir`."""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import TYPE_CHECKING

from rollart_sdk.cluster.handles import await_answer

if TYPE_CHECKING:
    from rollart_sdk.control.run_dir import RunDir
    from rollart_sdk.job.build import Job


def abandon(run_dir: RunDir, resumed: bool) -> None:
    """A run whose workers could not be started (no node provides a pool, a backend
    failed to construct) trained nothing: its new run directory is removed, so that
    output_dir is not littered with empty runs. A resumed run's directory is kept as is
    (its logs were only opened for appending)."""
    run_dir.close()
    if not resumed:
        shutil.rmtree(run_dir.path, ignore_errors=True)


def final_checkpoint(job: Job) -> list[str]:
    """The final checkpoint (``checkpoints/step-N``, unless this session already saved or
    resumed from the one of that step) and model; the errors, if any, said and returned
    as lines for the summary."""
    errors = _final_saves(job)
    for line in errors:
        job.pipeline.say(f"warning: {line}")
    return errors


def _final_saves(job: Job) -> list[str]:
    # Whatever ended the run (done, Ctrl-C, a failed weight sync), keep what was trained.
    # Every trainer rank takes part (collective for a tensor-parallel trainer). A dead
    # trainer cannot save: that is recorded, and the original error stays the error.
    p = job.pipeline
    try:
        version = await_answer(job.trainers[0].trainer.version(), 60)
        # First: a batch the trainer finished, its answer lost, counts as trained in the
        # saved state too.
        p.report_trained(version)  # trained, interrupted before its line
        asyncio.run(asyncio.wait_for(p.save_checkpoint(version, version, "final"), 600))
    except Exception as exc:  # noqa: BLE001 - reported in summary.json, never masks
        newest = p.newest_checkpoint_name()
        return [f"final checkpoint failed: {type(exc).__name__}: {exc}"[:1000]
                + f"; {newest or 'no checkpoint'} stays the newest"]
    if not job.config.train.save_final_model:
        return []
    return _final_model(job)


def _final_model(job: Job) -> list[str]:
    """``final_model/``: written beside it and renamed over it once complete, so a failed
    save leaves the previous one as it was."""
    from rollart_sdk import durable

    final = job.run_dir.path / "final_model"
    partial = final.with_name(f".final_model.{os.getpid()}.partial")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        asyncio.run(asyncio.wait_for(
            job.pipeline.all_trainers(lambda t: t.save_pretrained(str(partial))), 600))
        durable.fsync_tree(partial)
        durable.replace_dir(partial, final)
    except Exception as exc:  # noqa: BLE001 - reported in summary.json, never masks
        shutil.rmtree(partial, ignore_errors=True)
        return [f"save_pretrained failed: {type(exc).__name__}: {exc}"[:1000]]
    return []
