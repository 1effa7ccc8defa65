"""``rollart eval CONFIG [--checkpoint DIR]``: held-out evaluation of a model (one process).

Per task: success rate, mean reward and mean turns with 95 % intervals, on env seeds no
training run draws, with the config's ``eval.sampling`` (greedy by default); the result is
written as JSON (``--out``) and, with ``--json``, printed instead of the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rollart_sdk.config import load_config


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = minimum - 1
        if n < minimum:
            raise argparse.ArgumentTypeError(f"want a whole number >= {minimum}; got {text!r}")
        return n

    return parse


def _fmt(value: float | None, ci: list[float] | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    text = f"{value:.{digits}f}"
    return text + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")


def table(result: dict[str, Any]) -> list[str]:
    """The result as lines of text: one per task."""
    lines = [f"{'task':<16} {'episodes':>8}  {'success [95% CI]':<24} {'reward [95% CI]':<24} "
             f"{'turns [95% CI]':<22} {'dropped':>7} {'s':>6}"]
    for tag, r in result["tasks"].items():
        lines.append(f"{tag:<16} {r['completed']:>8}  {_fmt(r['success'], r['success_ci']):<24} "
                     f"{_fmt(r['reward'], r['reward_ci']):<24} "
                     f"{_fmt(r['turns'], r['turns_ci'], 2):<22} {sum(r['dropped'].values()):>7} "
                     f"{r['seconds']:>6.1f}")
    return lines


def default_out(output_dir: str, name: str, checkpoint: str | None) -> Path:
    """``OUTPUT_DIR/eval/NAME-<checkpoint or initial>-<time>.json``."""
    label = Path(checkpoint).name if checkpoint else "initial"
    return Path(output_dir) / "eval" / f"{name}-{label}-{time.strftime('%Y%m%d-%H%M%S')}.json"


def compare(result: dict[str, Any], baseline: str) -> None:
    """Add ``vs_baseline`` (episodes paired by seed with an earlier result) to each task
    the earlier result ``baseline`` (a JSON file of ``rollart eval``) has."""
    from rollart_sdk.control.evaluation import paired
    from rollart_sdk.errors import RollartError

    try:
        base = json.loads(Path(baseline).read_text())
        tasks = base["tasks"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RollartError(f"--baseline {baseline}: not a result of rollart eval "
                           f"({type(exc).__name__}: {exc})"[:400]) from None
    if base.get("sampling") != result["sampling"]:
        print(f"warning: --baseline {baseline} was sampled with {base.get('sampling')}, "
              f"this evaluation with {result['sampling']}", file=sys.stderr)
    for tag, r in result["tasks"].items():
        if tag in tasks:
            r["vs_baseline"] = paired(tasks[tag].get("per_episode", []), r["per_episode"])


def cmd_eval(args: argparse.Namespace) -> int:
    from rollart_sdk.errors import ConfigError
    from rollart_sdk.evaluate import evaluate

    log = (lambda line: print(line, file=sys.stderr)) if args.json else print
    run = Path(args.config)
    if run.is_dir() and (run / "config.yaml").is_file():
        # A run directory: its config, and by default its newest complete checkpoint.
        args.config = str(run / "config.yaml")
        if args.checkpoint is None:
            args.checkpoint = str(run)
            log(f"evaluating the run {run}: its config, its newest complete checkpoint "
                "(--checkpoint picks another)")
    cfg, lines = load_config(args.config, args.overrides)
    try:
        result = evaluate(cfg, lines, args.checkpoint, args.episodes, args.seed_offset, log=log)
    except ConfigError as exc:
        raise ConfigError(exc.problems, source=args.config) from None
    if args.baseline:
        compare(result, args.baseline)
    out = Path(args.out) if args.out else default_out(cfg.output_dir, cfg.name, result["checkpoint"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    s = result["sampling"]
    print(f"{result['checkpoint'] or 'initial weights'} (version {result['version']}): "
          f"{result['episodes']} episodes per task, env seeds {result['seeds'][0]}.."
          f"{result['seeds'][1]}, temperature {s['temperature']:g}; {result['wall_s']:.1f} s")
    for line in table(result):
        print(line)
    for tag, r in result["tasks"].items():
        if "vs_baseline" in r:
            v = r["vs_baseline"]
            print(f"{tag} vs {args.baseline}: {v['paired']} episodes on the same seeds, "
                  f"{v['gained']} solved now and not before, {v['lost']} the reverse "
                  f"(sign test p = {v['sign_test_p']:.3g})")
    print(f"written: {out}")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="held-out evaluation of the config's model or a checkpoint "
                                    "(greedy, unseen env seeds; one process)")
    p.add_argument("config", help="the run config, or a run directory (its config.yaml and, "
                   "unless --checkpoint says otherwise, its newest complete checkpoint)")
    p.add_argument("overrides", nargs="*",
                   help="dotted overrides, e.g. eval.sampling.temperature=0.7 eval.tasks=[Retry]")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="RUN/checkpoints/step-N, or a run directory (its newest complete "
                        "checkpoint); default: the config's model as built")
    p.add_argument("--episodes", type=_count(1), help="episodes per task (default: eval.episodes, 32)")
    p.add_argument("--seed-offset", type=_count(0),
                   help="first held-out seed is 2**31 + this (default: eval.seed_offset, 0)")
    p.add_argument("--out", metavar="FILE",
                   help="the JSON result (default: OUTPUT_DIR/eval/NAME-<checkpoint>-<time>.json)")
    p.add_argument("--baseline", metavar="FILE",
                   help="an earlier result (e.g. of the initial weights): episodes paired by "
                        "seed, gained and lost, sign test")
    p.add_argument("--json", action="store_true", help="print the JSON result, not a table")
    p.set_defaults(func=cmd_eval)
