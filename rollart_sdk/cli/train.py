"""``rollart train CONFIG``: build the job from the config and run it."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import TYPE_CHECKING, Any

from rollart_sdk.config import load_config
from rollart_sdk.control.buffer import decided_by
from rollart_sdk.job import ResumePoint, build_job, newest_checkpoint
from rollart_sdk.job.runtime import Runtime

if TYPE_CHECKING:
    from rollart_sdk.config import LineMap, RunConfig
    from rollart_sdk.job.build import Job


def cmd_train(args: argparse.Namespace) -> int:
    from rollart_sdk.ray_utils import local_ray_env

    local_ray_env()
    if args.address:
        os.environ["RAY_ADDRESS"] = args.address
    cfg, lines = load_config(args.config, args.overrides)
    return train(cfg, lines, args, runtime_for(cfg))


def runtime_for(cfg: RunConfig) -> Runtime:
    """How the config's workers run: for real (in process or on Ray: the layout), or with
    ``clock: simulated`` the simulator's runtime (the same workers and control plane on a
    virtual clock, docs/simulation.md). Either way the run is :func:`train`'s one path."""
    if cfg.clock == "simulated":
        from rollart_sdk.sim.job import SimRuntime

        return SimRuntime()
    return Runtime()


def train(cfg: RunConfig, lines: LineMap | None, args: argparse.Namespace,
          runtime: Runtime) -> int:
    """Check, build (:func:`~rollart_sdk.job.build_job`) and run the job on ``runtime``;
    print its outcome. ``args``: ``rollart train``'s (``config``, ``overrides``,
    ``steps``, ``resume``, ``address``, ``no_progress``)."""
    from rollart_sdk.errors import ConfigError

    steps = args.steps or cfg.train.steps
    try:
        resume = _resume_point(cfg, args, steps, runtime)
        layout = None
        if runtime.in_process is None:  # the simulator's runtime fixes where workers run
            from rollart_sdk.layout import choose_layout

            layout = choose_layout(cfg)
            print(layout.line())
        job = build_job(cfg, lines, resume=resume, layout=layout, runtime=runtime)
    except ConfigError as exc:
        raise ConfigError(exc.problems, source=args.config) from None
    code = _run(job, steps, args, runtime)
    if code:
        return code
    summary = json.loads((job.run_dir.path / "summary.json").read_text())
    for line in outcome_lines(summary):
        print(line)
    print(f"done: {job.run_dir.path}")
    return 0


def _resume_point(cfg: RunConfig, args: argparse.Namespace, steps: int,
                  runtime: Runtime) -> ResumePoint | None:
    if not args.resume:
        return None
    if runtime.no_resume is not None:
        from rollart_sdk.errors import ConfigError

        raise ConfigError([("--resume", f"{runtime.no_resume}; run it again without "
                            "--resume")])
    return ResumePoint.prepare(cfg, args.resume, steps)


def _run(job: Job, steps: int, args: argparse.Namespace, runtime: Runtime) -> int:
    """Run the built job; 0 when it ran to its end, else the exit code (the job is closed
    either way)."""
    from rollart_sdk.control.resume import ResumeFailed

    try:
        runtime.run(job, steps, progress=not args.no_progress)
    except KeyboardInterrupt:
        if job.resume is not None and not job.restored:
            print(f"interrupted ({job.signal}) before the checkpoint was loaded; nothing "
                  f"in {job.run_dir.path} was changed")
        else:
            for line in _faults_so_far(job):
                print(line)
            print(f"interrupted ({job.signal}); newest checkpoint: "
                  f"{newest_checkpoint(job.run_dir.checkpoints)}")
        print(_how_to_resume(args, job, steps))
        return 143 if job.signal == "SIGTERM" else 130
    except ResumeFailed:
        raise  # it says which checkpoints failed and why; nothing was written
    except Exception as exc:
        print(_how_to_resume(args, job, steps), file=sys.stderr)
        if not _worker_died(exc) or os.environ.get("ROLLART_TRACEBACK") == "1":
            raise
        # A worker process died (killed, OOM, a lost node): not a bug to trace in the SDK.
        # summary.json holds the whole error; the console gets the cause in one line.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"error: a worker died: {type(exc).__name__}: {first}"[:500]
              + f" (the whole error: {job.run_dir.path / 'summary.json'}; "
              "ROLLART_TRACEBACK=1 prints the traceback)", file=sys.stderr)
        return 1
    finally:
        job.close()
        _skip_final_collection()
    return 0


def outcome_lines(summary: dict[str, Any]) -> list[str]:
    """The console lines of a finished run, from its ``summary.json``: on simulated time
    the virtual and wall seconds, then what was learnt and what the rollout cost."""
    from rollart_sdk.control.metrics import learning_lines

    out = []
    if "virtual_s" in summary:  # a run on simulated time (sim/job.py::run_sim)
        n = summary["steps"]
        out.append(f"simulated {n} steps: {summary['virtual_s']:.0f} virtual s "
                   f"({summary['virtual_s'] / max(n, 1):.1f} s a step) in "
                   f"{summary['wall_s']:.1f} wall s; {summary['launched']} launched, "
                   f"{summary['trained']} trained")
    out.extend(learning_lines(summary["learning"]))
    ro = summary["rollout"]
    bias = ", ".join(f"{tag} {b:.2f}" for tag, b in ro["length_bias"].items())
    out.append(f"rollout: {ro['launched']} launched, {ro['trained']} trained; waste "
               f"{ro['waste']:.0%} of trajectories, {ro['waste_tokens']:.0%} of generated "
               f"tokens; {ro['spanning_update']} trained across a weight update; length "
               f"bias {bias}")
    out.extend(fault_lines(summary))
    return out


def fault_lines(summary: dict[str, Any]) -> list[str]:
    """What went wrong during the run and how it was handled, one line a kind, from its
    ``summary.json`` (none when nothing did): engines that died and came back (or did
    not), trajectories dropped and why (not those still running when the run stopped),
    env calls past their timeout, side errors, env closes and checkpoint saves that
    failed."""
    out = []
    rec = summary.get("engine_recovery") or {}
    deaths, back = rec.get("deaths") or {}, rec.get("recovered") or {}
    if deaths:
        line = "engines: " + "; ".join(f"{w} died {n}x, came back {back.get(w, 0)}x"
                                       for w, n in sorted(deaths.items()))
        if rec.get("rerouted_requests"):
            line += (f"; {rec['rerouted_requests']} requests re-sent (to another engine, "
                     "or to the same one once back)")
        out.append(line)
    for w, why in sorted((rec.get("failed") or {}).items()):
        out.append(f"engine {w} did not come back: {why}")
    # Still running when the run stopped (``...run_end``): the stop, not a fault. What the
    # staleness bound or redundant rollout's surplus decided is said apart from failures.
    dropped = {r: n for r, n in (summary.get("dropped") or {}).items()
               if n and not r.endswith("run_end")}
    decided = {r: n for r, n in dropped.items() if decided_by(r)}
    failed = {r: n for r, n in dropped.items() if r not in decided}
    launched = summary.get("launched", "?")
    if failed:
        out.append(f"dropped: {sum(failed.values())} of {launched} trajectories "
                   f"({_counts(failed)}); drops.jsonl has each one's reason")
    if decided:
        kinds = {decided_by(r) for r in decided}
        why = [what for kind, what in DECIDED_WHY if kind in kinds]
        out.append(f"not trained by design: {sum(decided.values())} of {launched} "
                   f"({_counts(decided)}: {'; '.join(why)})")
    late = {k: sum(t.get(k, 0) for t in ((summary.get("envs") or {}).get("threads") or {})
                   .values()) for k in ("timed_out", "refused")}
    if any(late.values()):
        out.append(f"env calls: {late['timed_out']} past their timeout, {late['refused']} "
                   "refused (a host's threads all held by hung calls)")
    side = (summary.get("side_errors") or {}).get("count", 0)
    if side:
        out.append(f"side errors: {side} (examples: summary.json, side_errors)")
    closes = summary.get("env_close_errors") or {}
    if closes:
        out.append("env closes failed: " + ", ".join(f"{k} {v}" for k, v in closes.items()))
    saves = summary.get("checkpoint_errors") or []
    if saves:
        out.append(f"checkpoint saves failed: {len(saves)} (the last: {saves[-1][:300]})")
    return out


# What each decision of the control plane (control/buffer.py::decided_by) is, in words.
DECIDED_WHY = (("stale", "the staleness bound, rollout.alpha"),
               ("surplus", "redundant rollout's surplus"),
               ("zero_variance", "the zero-variance filter"))


def _counts(reasons: dict[str, int]) -> str:
    return ", ".join(f"{r} {n}" for r, n in sorted(reasons.items(), key=lambda x: -x[1]))


def _faults_so_far(job: Job) -> list[str]:
    """The fault lines of a stopped run, from the summary.json its stop wrote (none when
    it could not be read)."""
    try:
        return fault_lines(json.loads((job.run_dir.path / "summary.json").read_text()))
    except (OSError, ValueError):
        return []


def _skip_final_collection() -> None:
    """The run is over (checkpoint, summary and logs written, workers and Ray closed):
    move every object to the collector's permanent generation, so that the interpreter's
    exit does not walk the run's whole heap once more. That last collection took 6-11 s
    of a stop on a loaded 2-core machine (the heap partly swapped out), most of the time
    from SIGTERM to exit; nothing it would free outlives the process anyway."""
    import gc

    gc.freeze()


def _how_to_resume(args: argparse.Namespace, job: Any, steps: int) -> str:
    """The command that finishes the run that was asked for: the same config, overrides,
    ``--steps`` and ``--address``, each word shell-quoted, with ``--resume``."""
    from rollart_sdk.control.resume import newest_resumable

    ckpt = newest_resumable(job.run_dir.path)
    if ckpt is None:
        return ("no complete checkpoint was saved (periodic ones: train.checkpoint_every_s, "
                "train.checkpoint_every); start the run again")
    words = ["rollart", "train", args.config, *args.overrides, "--steps", str(steps)]
    if args.address:
        words += ["--address", args.address]
    words += ["--resume", str(job.run_dir.path)]
    return f"newest checkpoint: {ckpt}; continue the run with: {shlex.join(words)}"


_WORKER_DEATHS = ("RayActorError", "ActorDiedError", "ActorUnavailableError",
                  "WorkerCrashedError", "NodeDiedError", "OutOfMemoryError")


def _worker_died(exc: BaseException) -> bool:
    """Ray's word for a worker process that is gone (by class name, so that this module
    does not import Ray)."""
    return type(exc).__module__.startswith("ray.") and any(
        c.__name__ in _WORKER_DEATHS for c in type(exc).__mro__)


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("train", help="run the pipeline (in this process, or on Ray: the "
                       "config's layout, docs/configuration.md#layout)")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.alpha=2")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or local)")
    p.add_argument("--steps", type=int, help="override train.steps")
    p.add_argument("--no-progress", action="store_true", help="plain log lines only")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue that run from its newest complete checkpoint (same config; "
                   "train.steps may be raised); metrics.jsonl and the logs are appended to")
    p.set_defaults(func=cmd_train)
