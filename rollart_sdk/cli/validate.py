"""``rollart validate CONFIG``: resolve every backend, check every options block, and run
what ``train`` checks before starting workers (output dir, model, context budgets)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from rollart_sdk.cli.output import console


def _say(text: str) -> None:
    """A line of the checks (warnings name packages like 'pkg[extra]': not markup)."""
    console.print(text, markup=False, highlight=False)


def cmd_validate(args: argparse.Namespace) -> int:
    from rollart_sdk.cli.train import runtime_for
    from rollart_sdk.config import load_config
    from rollart_sdk.config.resolve import resolve_run
    from rollart_sdk.errors import ConfigError
    from rollart_sdk.layout import choose_layout, inprocess_config
    from rollart_sdk.plugins import get_plugins
    from rollart_sdk.resources.plan import plan_resources

    cfg, lines = load_config(args.config, args.overrides)
    try:
        plugins = get_plugins()
        # `train`'s runtime: with clock: simulated the sim's checks, every worker in one process
        runtime = runtime_for(cfg)
        layout = None if runtime.in_process else choose_layout(cfg, plugins.registry)
        in_process = bool(runtime.in_process) or (layout is not None and layout.in_process)
        resolved = resolve_run(inprocess_config(cfg) if in_process else cfg,
                               plugins.registry, lines, in_process=in_process)
        # Pools, affinities and the role workers' decorators, checked against each other.
        plan = plan_resources(cfg, resolved, workers=runtime.role_workers())
        # What `train` (or `sim`) checks before any worker starts: output dir, model,
        # context budgets (a simulated run's: its first prompts against the engines' KV).
        runtime.check(cfg, resolved, plan, lines, _say, build_model=False)
    except ConfigError as exc:
        raise ConfigError(exc.problems, source=args.config) from None
    for warning in plugins.warnings:
        console.print(f"[yellow]warning[/yellow]: {escape(warning)}")
    console.print(f"[green]ok[/green]: {escape(args.config)} is valid")
    for warning in plan.warnings:
        console.print(f"[yellow]warning[/yellow]: {escape(warning)}")
    if layout is not None:
        console.print(f"  {layout.line()}")
    for kind in ("engine", "trainer", "transport", "placement"):
        r = getattr(resolved, kind)
        console.print(f"  {kind}: {r.descriptor.name} ({r.descriptor.distribution or r.descriptor.plugin})")
    for tag in resolved.envs:
        console.print(
            f"  task {tag}: env {resolved.envs[tag].descriptor.name}, "
            f"reward {resolved.rewards[tag].descriptor.name}"
        )
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("validate", help="load a config, resolve every backend, check options")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.alpha=2")
    p.set_defaults(func=cmd_validate)
