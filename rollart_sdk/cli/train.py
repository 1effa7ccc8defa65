"""``rollart train CONFIG``: build the job from the config and run it."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any

from rollart_sdk.config import load_config
from rollart_sdk.job import ResumePoint, build_job, newest_checkpoint, run_job


def cmd_train(args: argparse.Namespace) -> int:
    from rollart_sdk.ray_utils import local_ray_env

    local_ray_env()
    if args.address:
        os.environ["RAY_ADDRESS"] = args.address
    from rollart_sdk.errors import ConfigError

    cfg, lines = load_config(args.config, args.overrides)
    if cfg.clock == "simulated":  # the sim backends on virtual time (docs/simulation.md)
        from rollart_sdk.cli.sim import simulate

        return simulate(cfg, lines, args.steps, source=args.config)
    steps = args.steps or cfg.train.steps
    resume = ResumePoint.prepare(cfg, args.resume, steps) if args.resume else None
    from rollart_sdk.layout import choose_layout

    try:
        layout = choose_layout(cfg)
        print(layout.line())
        job = build_job(cfg, lines, resume=resume, layout=layout)
    except ConfigError as exc:
        raise ConfigError(exc.problems, source=args.config) from None
    from rollart_sdk.control.resume import ResumeFailed

    try:
        run_job(job, steps, progress=not args.no_progress)
    except KeyboardInterrupt:
        if resume is not None and not job.restored:
            print(f"interrupted ({job.signal}) before the checkpoint was loaded; nothing "
                  f"in {job.run_dir.path} was changed")
        else:
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
    summary = json.loads((job.run_dir.path / "summary.json").read_text())
    from rollart_sdk.control.metrics import learning_lines

    for line in learning_lines(summary["learning"]):
        print(line)
    ro = summary["rollout"]
    bias = ", ".join(f"{tag} {b:.2f}" for tag, b in ro["length_bias"].items())
    print(f"rollout: {ro['launched']} launched, {ro['trained']} trained; waste "
          f"{ro['waste']:.0%} of trajectories, {ro['waste_tokens']:.0%} of generated tokens; "
          f"{ro['spanning_update']} trained across a weight update; length bias {bias}")
    print(f"done: {job.run_dir.path}")
    return 0


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
