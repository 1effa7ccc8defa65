"""``rollart sim CONFIG``: run a job on simulated time (docs/simulation.md);
``rollart sim --experiment NAME``: reproduce one of the paper's figures."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rollart_sdk.cli.output import console


def cmd_sim(args: argparse.Namespace) -> int:
    from rollart_sdk.errors import ConfigError

    if args.experiment:
        from rollart_sdk.sim.experiments import run_experiment

        return run_experiment(args.experiment, json_path=args.json, png=args.png,
                              quick=args.quick, out=console.print)
    if not args.config:
        raise ConfigError([("rollart sim", "give a CONFIG, or --experiment NAME "
                            "(rollart sim --list shows the experiments)")])
    from rollart_sdk.config import load_config

    cfg, lines = load_config(args.config, args.overrides)
    return simulate(cfg, lines, args.steps, source=args.config)


def simulate(cfg: Any, lines: Any, steps: int | None, source: str | None = None) -> int:
    """Build and run ``cfg`` on simulated time; print where the run directory is."""
    from rollart_sdk.errors import ConfigError
    from rollart_sdk.sim.job import build_sim_job, run_sim

    try:
        job = build_sim_job(cfg, lines, log=console.print)
    except ConfigError as exc:
        raise ConfigError(exc.problems, source=source) from None
    run_sim(job, steps or cfg.train.steps, log=console.print)
    summary = json.loads((job.run_dir.path / "summary.json").read_text())
    n = summary["steps"]
    console.print(f"simulated {n} steps: {summary['virtual_s']:.0f} virtual s "
                  f"({summary['virtual_s'] / max(n, 1):.1f} s a step) in "
                  f"{summary['wall_s']:.1f} wall s; {summary['launched']} launched, "
                  f"{summary['trained']} trained")
    console.print(f"done: {job.run_dir.path}")
    return 0


def cmd_list() -> int:
    from rollart_sdk.sim.experiments import EXPERIMENTS

    for name, exp in EXPERIMENTS.items():
        console.print(f"{name}: {exp.summary}")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sim", help="run a config, or a paper experiment, on simulated time")
    p.add_argument("config", nargs="?")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.alpha=2")
    p.add_argument("--steps", type=int, help="override train.steps")
    p.add_argument("--experiment", help="a paper figure to reproduce (see --list)")
    p.add_argument("--list", action="store_true", help="list the experiments")
    p.add_argument("--json", help="write the experiment's rows to this file")
    p.add_argument("--png", help="write the experiment's figure here (needs matplotlib)")
    p.add_argument("--quick", action="store_true", help="fewer steps and points (tests)")
    p.set_defaults(func=lambda a: cmd_list() if a.list else cmd_sim(a))
