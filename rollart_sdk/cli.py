"""The ``rollart`` command line: plugins, validate, train, bench, report, status."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from rollart_sdk.errors import RollartError

console = Console()
if not console.is_terminal:  # piped or captured: do not wrap names at 80 columns
    console = Console(width=200)
err_console = Console(stderr=True)

# name -> "module:function(argv) -> int"; each benchmark owns its arguments.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "dispatch": ("rollart_sdk.bench.dispatch:main", "Cluster call overhead vs a raw Ray actor call"),
    "engine": ("rollart_engine_torch.bench:main",
               "torch engine vs static generate; --engine vllm: vLLM vs torch vs static"),
    "engine-vllm": ("rollart_engine_vllm.bench:main",
                    "vLLM vs torch engine vs static generate (same as engine --engine vllm)"),
    "straggler": ("rollart_sdk.bench.straggler:main",
                  "trajectory-level vs batched env interaction under env latency"),
    "weights": ("rollart_sdk.bench.weights:main",
                "weight transports on the real pipeline: transfer, exposed, hidden fraction"),
    "async": ("rollart_sdk.bench.async_modes:main",
              "sync vs one_off vs async alpha 1/2: step time, staleness, aborts"),
    "trainers": ("rollart_trainer_megatron.bench:main",
                 "trainer megatron (TP 1, TP 2) vs torch: step time on one batch"),
}


def cmd_plugins(args: argparse.Namespace) -> int:
    from rollart_sdk.plugins import get_plugins

    ps = get_plugins()
    if args.json:
        print(json.dumps([r.to_json() for r in ps.records.values()], indent=2))
        return 0
    table = Table(title="rollart plugins")
    for col in ("plugin", "distribution", "version", "registers", "status"):
        table.add_column(col)
    for rec in ps.records.values():
        regs = "\n".join(
            f"{kind}: {len(names)} names, e.g. {names[0]}  [dim](rollart envs / plugins --json)[/dim]"
            if len(names) > 12 else
            "\n".join(f"{kind}: {name}  [dim]{rec.summaries.get(f'{kind}:{name}', '')}[/dim]"
                      for name in names)
            for kind, names in rec.registered.items()
        )
        status = (
            "[yellow]disabled[/yellow]"
            if rec.disabled
            else f"[red]error: {rec.error}[/red]" if rec.error else "[green]ok[/green]"
        )
        if rec.unavailable:  # names the plugin knows but could not register here, and why
            regs = (regs + "\n" if regs else "") + f"[yellow]not registered: {len(rec.unavailable)}[/yellow]"
        table.add_row(rec.name, rec.distribution or "-", rec.version or "-", regs or "-", status)
    console.print(table)
    for rec in ps.records.values():
        if rec.unavailable:
            console.print(f"\n[bold]{rec.name}[/bold] does not register:")
            for name, reason in sorted(rec.unavailable.items()):
                console.print(f"  {name}: {reason}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from rollart_sdk.config import load_config
    from rollart_sdk.errors import ConfigError
    from rollart_sdk.plugins import get_plugins
    from rollart_sdk.resolve import resolve_run
    from rollart_sdk.resources.plan import plan_resources

    cfg, lines = load_config(args.config, args.overrides)
    try:
        resolved = resolve_run(cfg, get_plugins().registry, lines)
        plan = plan_resources(cfg, resolved)  # decorator and affinity misuse is rejected here
    except ConfigError as exc:
        raise ConfigError(exc.problems, source=args.config) from None
    console.print(f"[green]ok[/green]: {args.config} is valid")
    for warning in plan.warnings:
        console.print(f"[yellow]warning[/yellow]: {warning}")
    for kind in ("engine", "trainer", "transport", "placement"):
        r = getattr(resolved, kind)
        console.print(f"  {kind}: {r.descriptor.name} ({r.descriptor.distribution or r.descriptor.plugin})")
    for tag in resolved.envs:
        console.print(
            f"  task {tag}: env {resolved.envs[tag].descriptor.name}, "
            f"reward {resolved.rewards[tag].descriptor.name}"
        )
    return 0


def cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    from rollart_sdk.registry import import_string

    if args.name not in BENCHMARKS:
        names = ", ".join(sorted(BENCHMARKS)) or "(none)"
        err_console.print(f"[red]unknown benchmark {args.name!r}[/red]; available: {names}")
        return 2
    name = args.name
    # `rollart bench NAME --engine E` runs benchmark NAME-E when one is registered.
    engine = _option_value(rest, "--engine")
    if engine and f"{name}-{engine}" in BENCHMARKS:
        name = f"{name}-{engine}"
    fn: Callable[[list[str]], int] = import_string(BENCHMARKS[name][0])
    return int(fn(rest) or 0)


def _option_value(argv: list[str], option: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollart", description="Disaggregated agentic RL (ROLLART) from plugins."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list installed plugins and what they register")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plugins)
    p = sub.add_parser("validate", help="load a config, resolve every backend, check options")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.alpha=2")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("bench", help="run a benchmark (prints a table; --json PATH writes JSON)")
    p.add_argument(
        "name",
        help="; ".join(f"{k}: {v[1]}" for k, v in sorted(BENCHMARKS.items())) or "benchmark",
    )
    p.set_defaults(func=cmd_bench, takes_rest=True)
    for extra in _extra_commands():
        extra(sub)
    return parser


def _extra_commands() -> list[Callable[[argparse._SubParsersAction], None]]:
    """Commands that live with the plane they drive (train, report, status)."""
    from rollart_sdk.registry import import_string

    return [import_string(spec) for spec in EXTRA_COMMANDS]


# "module:add_parser(subparsers)" for commands that belong to a plane.
EXTRA_COMMANDS: list[str] = [
    "rollart_sdk.models:add_parser",
    "rollart_sdk.train:add_parser",
    "rollart_sdk.report:add_parser",
    "rollart_sdk.env_catalog:add_parser",
    "rollart_sdk.resources.status:add_parser",
]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and hasattr(args, "overrides"):
        # `rollart train CONFIG --steps 3 a.b=1`: overrides may follow options too.
        args.overrides = list(args.overrides or []) + [r for r in rest if "=" in r and not r.startswith("-")]
        rest = [r for r in rest if not ("=" in r and not r.startswith("-"))]
    if rest and not getattr(args, "takes_rest", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if getattr(args, "takes_rest", False):
            return args.func(args, rest)
        return int(args.func(args) or 0)
    except RollartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
