"""``rollart envs [NAME...]``: every environment with its options, turn budget and
prefill/decode character (the traits its plugin declares); simulated workloads (``sim``,
trait ``simulated``) are named apart below the table unless asked for by name."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.markup import escape

from rollart_sdk.cli.env_catalog import describe


def cmd_envs(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from rollart_sdk.plugins import get_plugins

    ps = get_plugins()
    registry = ps.registry
    names = args.names or registry.names("env")
    descs = [registry.get("env", n) for n in names]  # an unknown name: the usual clear error
    # Backends that only model time (rollart sim) are no environments to train on: listed
    # apart unless named.
    simulated = [d.name for d in descs if d.traits.get("simulated") and not args.names]
    descs = [d for d in descs if d.name not in simulated]
    details = bool(args.names) or args.details
    records = [describe(d, details) for d in descs]
    if args.json:
        print(json.dumps(records, indent=2, default=str))
        return 0
    console = Console() if Console().is_terminal else Console(width=200)
    table = Table(title="rollart environments")
    for col in ("env", "plugin", "turns", "character", "options"):
        table.add_column(col)
    option_names: dict[str, str] = {}
    for desc, rec in zip(descs, records, strict=True):
        key = str(desc.options)
        if key not in option_names:
            try:
                option_names[key] = ", ".join(desc.options_model().model_fields) or "-"
            except Exception as exc:  # noqa: BLE001
                option_names[key] = f"[red]{type(exc).__name__}[/red]"
        table.add_row(rec["name"], rec["plugin"], str(rec["turns"] or "-"),
                      rec["character"] or "-", option_names[key])
    console.print(table)
    if details:
        for rec in records:
            console.print(f"\n[bold]{escape(rec['name'])}[/bold]  {escape(rec['summary'])}")
            for opt in rec.get("options", []):
                console.print(f"  {escape(opt['name'])} = {escape(repr(opt['default']))}  "
                              f"[dim]{escape(opt['description'])}[/dim]")
            if "options_error" in rec:
                console.print(f"  [red]options: {escape(rec['options_error'])}[/red]")
    if simulated:
        console.print(f"\nSimulated workloads (rollart sim, clock: simulated; no text "
                      f"environment): {', '.join(simulated)}")
    unavailable = sorted(n for (k, n) in registry.unavailable if k == "env")
    if unavailable and not args.names:  # asked for named envs: only those
        console.print(f"\n{len(unavailable)} env names known but not registered here "
                      "(`rollart plugins --details` says why).")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("envs", help="list environments: options, turn budget, prefill/decode character")
    p.add_argument("names", nargs="*", help="only these envs, with their options in full")
    p.add_argument("--details", action="store_true", help="every env's options in full")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_envs)
