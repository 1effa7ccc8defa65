"""``rollart report RUN_DIR``: learning curves, rollout health and a worker timeline (PNG)."""

from __future__ import annotations

import argparse
from typing import Any

from rollart_sdk.cli.report_plots import make_report


def _window(text: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--window wants START:END in seconds, e.g. 30:60; got {text!r}") from None
    if b <= a:
        raise argparse.ArgumentTypeError(f"--window {text!r}: END must be after START")
    return a, b


def cmd_report(args: argparse.Namespace) -> int:
    window = args.window
    if args.max_seconds is not None:
        window = (0.0, args.max_seconds)
    for p in make_report(args.run_dir, window, args.full, args.smooth):
        print(p)
    from pathlib import Path

    samples = Path(args.run_dir) / "samples.jsonl"
    if samples.exists() and samples.stat().st_size:
        print(f"{samples}  (trajectories as the model saw them: rollart samples "
              f"{args.run_dir} [--task T] [--step N] [--worst|--best])")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="draw learning curves, rollout health and a worker timeline (PNG)")
    p.add_argument("run_dir")
    p.add_argument("--window", type=_window, metavar="START:END",
                   help="timeline: seconds since the first event (default: three training "
                        "steps in the middle of the run)")
    p.add_argument("--full", action="store_true", help="timeline: the whole run")
    p.add_argument("--max-seconds", type=float, help="timeline: the first N seconds (= --window 0:N)")
    p.add_argument("--smooth", type=int, metavar="STEPS",
                   help="moving-average window for the curves (default: a twentieth of the run)")
    p.set_defaults(func=cmd_report)
