"""``summary.json``: what a run did, collected from the control plane and the workers
once it stopped, whatever stopped it (:func:`collect`), and written atomically
(:func:`write_summary`). docs/failures.md reads its failure keys."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from typing import TYPE_CHECKING, Any

from rollart_sdk.cluster.handles import await_answer

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from rollart_sdk.cluster.handles import EngineClient
    from rollart_sdk.control.pipeline import Pipeline
    from rollart_sdk.job.build import Job

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain(text: str) -> str:
    """``text`` without terminal colour codes (Ray colours its error texts)."""
    return _ANSI.sub("", text)


def collect(job: Job, interrupted: bool, error: Exception | None,
            save_errors: list[str]) -> dict[str, Any]:
    """The summary of a stopped run (the metric sinks are closed here: their failures
    are part of it)."""
    from rollart_sdk.control.metrics import learning_summary, run_rollout_summary
    from rollart_sdk.job.resume import newest_checkpoint

    p = job.pipeline
    return {
        # Steps trained (each has its metrics line), sessions before a resume too; a batch
        # formed whose train step the stop cut is not one.
        "steps": p.steps_done,
        "interrupted": interrupted,
        # Ray's error texts carry terminal colour codes: plain text in the file.
        "error": plain(f"{type(error).__name__}: {error}") if error else None,
        "signal": job.signal,
        "checkpoint_errors": [plain(e) for e in save_errors],
        "newest_checkpoint": newest_checkpoint(job.run_dir.checkpoints),
        # Accounting: launched = trained + sum(dropped) (reason -> count).
        "launched": p.scheduler.launched,
        "trained": p.buffer.trained,
        "dropped": dict(p.buffer.dropped),
        "trajectories_trained": p.buffer.trained,
        # Dynamic sampling: groups dropped as zero_variance, and kept past the cap.
        "filtered_groups": p.buffer.filtered_groups,
        "zero_variance_kept": p.buffer.zero_variance_kept,
        "retried": p.scheduler.retried,
        "drop_examples": job.run_dir.drop_examples,
        "engine_recovery": {**p.recovery.summary(), "rerouted_requests": p.proxy.rerouted,
                            "down_at_end": dict(p.proxy.down),
                            # rounds re-formed without a dead engine (version, left out)
                            "reformed_rounds": [{"version": v, "left_out": gone}
                                                for v, gone in p.weights.reforms]},
        "engine_versions": engine_versions(p),
        "env_close_errors": dict(job.run_dir.close_errors),
        # Errors beside a trajectory's outcome (a finish hook, an env slot): count, examples.
        "side_errors": {"count": p.scheduler.side_error_count,
                        "examples": list(p.scheduler.side_errors)},
        "events_not_written": job.run_dir.events_dropped,
        "rollout_s": (p.ended or time.time()) - p.started,  # start to the rollout's stop
        "rollout": run_rollout_summary(p),
        "served": {f"{tag}@{w}": n for (tag, w), n in p.proxy.served.items()},
        "weight_updates": [vars(r) for r in p.update_reports],
        "wall_time_s": time.time() - p.started,  # this session
        "resumed_from": str(job.resume.checkpoint) if job.resume else None,
        "resumes": p.resumes,
        "layout": job.layout.to_json() if job.layout else None,
        "envs": env_summary(job),
        "learning": learning_summary(p),
        "eval": p.eval_lines[-1] if p.eval_lines else None,  # the last held-out evaluation
        "engines": engine_stats(p),
        "sinks": close_sinks(job),
    }


def write_summary(job: Job, summary: dict[str, Any]) -> OSError | None:
    """summary.json, atomically (the old one or this one, never a torn file); a full disk
    is said in one line and returned, so the run's own error stays the error shown."""
    try:
        job.run_dir.write_json("summary.json", summary)
    except OSError as exc:
        print(f"warning: summary.json not written ({type(exc).__name__}: {exc}); the "
              "previous one, if any, is left as it was", file=sys.stderr)
        return exc
    return None


def close_sinks(job: Job) -> dict[str, Any]:
    """Close the metric sinks (their last writes); per sink, the failures counted."""
    if job.sinks is None:
        return {}
    job.sinks.close()
    return job.sinks.summary()


def env_summary(job: Job) -> dict[str, Any]:
    """Per task: pool size, slots used, episodes, failures; per worker: instances built;
    per thread host (env_host: thread): its hung, timed-out and refused calls."""
    sched = job.pipeline.scheduler
    pools: dict[str, Any] = {
        tag: {"size": len(p.slots), "slots_used": sum(1 for s in p.slots if s.episodes),
              "episodes": sum(s.episodes for s in p.slots), "failures": p.failures}
        for tag, p in sched.pools.items()}
    built: dict[str, int] = {}
    threads: dict[str, Any] = {}
    for w in sched.env_workers:
        try:
            stats = await_answer(w.env.stats(), 30)
        except Exception as exc:  # noqa: BLE001 - a dead env worker: say so in the summary
            built[f"error:{w.name}"] = 0
            pools.setdefault("_errors", {})[w.name] = f"{type(exc).__name__}: {exc}"
            continue
        for tag, n in stats["constructions"].items():
            built[tag] = built.get(tag, 0) + n
        if "hung" in stats:  # calls past their timeout, each still on a thread of this process
            threads[w.name] = {k: stats.get(k, 0) for k in ("hung", "hung_peak", "timed_out",
                                                             "refused", "closed_late")}
    return {"pools": pools, "constructions": built, "threads": threads}


def _ask_engines(p: Pipeline, ask: Callable[[EngineClient], Awaitable[Any]],
                 answer: Callable[[Any], Any], failed: Callable[[str], Any]) -> dict[str, Any]:
    """``{engine name: answer(reply)}`` for every engine's reply to ``ask(client)`` (30 s
    each), ``failed("Type: message")`` for an engine that raised or did not answer in
    time, or ``{"error": ...}`` when the engines could not be asked at all."""
    engines = p.weight_sync.engines

    async def gather() -> list[Any]:
        return list(await asyncio.gather(*(asyncio.wait_for(ask(e.engine), 30)
                                           for e in engines), return_exceptions=True))

    try:
        replies = asyncio.run(gather())
    except Exception as exc:  # noqa: BLE001 - reported in summary.json, never masks
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    return {e.name: (answer(r) if not isinstance(r, BaseException)
                     else failed(f"{type(r).__name__}: {r}"))
            for e, r in zip(engines, replies, strict=True)}


def engine_versions(p: Pipeline) -> dict[str, Any]:
    """The version each engine serves at the end, or the error that kept one from saying
    (a dead engine; a restarted one that has not reloaded says so)."""
    return _ask_engines(p, lambda e: e.weights_status(), lambda a: int(a["engine_version"]),
                        lambda err: err[:300])


def engine_stats(p: Pipeline) -> dict[str, Any]:
    """Each engine worker's counters at run end (tokens prefilled, reused, generated; KV
    cache; PD hand-off errors), or the error that kept one from answering."""
    return _ask_engines(p, lambda e: e.stats(), lambda s: s, lambda err: {"error": err[:500]})
