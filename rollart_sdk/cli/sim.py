"""``rollart sim CONFIG``: run a job on simulated time (docs/simulation.md);
``rollart sim --experiment NAME``: reproduce one of the paper's figures.

The experiments are a benchmark (``paper``, registered by the first-party package
``rollart-benchmark-suite`` through the benchmark hook); ``--experiment NAME`` and
``--list`` run it as ``rollart bench paper NAME`` and ``rollart bench paper --list``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def cmd_sim(args: argparse.Namespace) -> int:
    from rollart_sdk.errors import ConfigError

    if args.experiment:
        argv = [args.experiment]
        argv += ["--json", args.json] if args.json else []
        argv += ["--png", args.png] if args.png else []
        argv += ["--quick"] if args.quick else []
        return _paper(argv)
    if not args.config:
        raise ConfigError([("rollart sim", "give a CONFIG, or --experiment NAME "
                            "(rollart sim --list shows the experiments)")])
    from rollart_sdk.config import load_config

    cfg, lines = load_config(args.config, args.overrides)
    return simulate(cfg, lines, args)


def simulate(cfg: Any, lines: Any, args: argparse.Namespace) -> int:
    """``cfg`` on simulated time, whatever its ``clock``: ``rollart train``'s one path
    (:func:`rollart_sdk.cli.train.train`) with the simulator's runtime."""
    from rollart_sdk.cli.train import train
    from rollart_sdk.sim.job import SimRuntime

    run_args = argparse.Namespace(config=args.config, overrides=args.overrides,
                                  steps=args.steps, resume=None, address=None,
                                  no_progress=True)
    return train(cfg, lines, run_args, SimRuntime())


def cmd_list() -> int:
    return _paper(["--list"])


def _paper(argv: list[str]) -> int:
    """The registered benchmark ``paper``; without it, what to install."""
    from rollart_sdk.errors import ConfigError
    from rollart_sdk.plugins import get_registry
    from rollart_sdk.registry import install_hint

    registry = get_registry()
    if "paper" not in registry.names("benchmark"):
        raise ConfigError([("rollart sim --experiment",
                            "the paper's experiments come with the benchmark suite. "
                            + install_hint("benchmark", "paper", registry.not_loaded))])
    fn: Callable[[list[str]], int] = registry.get("benchmark", "paper").load()
    return int(fn(argv) or 0)


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
