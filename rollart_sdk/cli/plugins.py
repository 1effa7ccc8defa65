"""``rollart plugins``: the installed plugins, what each registers, and its status.

``--kind KIND`` lists one kind only; ``--options NAME`` (``KIND:NAME`` when two kinds share
the name) prints that backend's options model; ``--strict`` exits 1 when any plugin is
disabled by a typo, broken or in conflict (the listing itself always exits 0).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.markup import escape
from rich.table import Table

from rollart_sdk.cli.output import console, err_console
from rollart_sdk.errors import RollartError
from rollart_sdk.interfaces import KINDS


def _status_markup(rec: Any) -> str:
    if rec.disabled:
        return f"[yellow]{escape(rec.status)}[/yellow]"
    if rec.error or rec.conflicts:
        return f"[red]{escape(rec.status)}[/red]"
    return "[green]ok[/green]"


def _registrations(rec: Any, kind: str, names: list[str]) -> str:
    if len(names) > 12:  # a plugin with many names (e.g. gem/...): rollart envs lists them
        return f"{kind}: {len(names)} names, e.g. {names[0]}  [dim](rollart envs / plugins --json)[/dim]"
    return "\n".join(
        f"{kind}: {name}  [dim]{escape(rec.summaries.get(f'{kind}:{name}', ''))}[/dim]"
        for name in names
    )


def cmd_plugins(args: argparse.Namespace) -> int:
    from rollart_sdk.plugins import get_plugins

    ps = get_plugins()
    if args.options:
        return _print_options(ps.registry, args.options, args.json)
    records = [r for r in ps.records.values()
               if not args.kind or args.kind in r.registered or r.error or r.disabled]
    if args.json:
        print(json.dumps([r.to_json() for r in records], indent=2))
    else:
        table = Table(title="rollart plugins" + (f" (kind {args.kind})" if args.kind else ""))
        for col in ("plugin", "distribution", "version", "registers", "status"):
            table.add_column(col)
        for rec in records:
            regs = "\n".join(
                _registrations(rec, kind, names)
                for kind, names in rec.registered.items()
                if not args.kind or kind == args.kind
            )
            if rec.unavailable:  # names the plugin knows but could not register here
                regs = (regs + "\n" if regs else "") + (
                    f"[yellow]not registered: {len(rec.unavailable)}[/yellow]")
            table.add_row(rec.name, rec.distribution or "-", rec.version or "-", regs or "-",
                          _status_markup(rec))
        console.print(table)
        for rec in records:
            if rec.unavailable:
                console.print(f"\n[bold]{rec.name}[/bold] does not register:")
                for name, reason in sorted(rec.unavailable.items()):
                    console.print(f"  {name}: {escape(reason)}")
    for warning in ps.warnings:
        err_console.print(f"[yellow]warning[/yellow]: {escape(warning)}")
    bad = [r for r in ps.records.values() if r.error or r.conflicts]
    return 1 if args.strict and (bad or ps.warnings) else 0


def _print_options(registry: Any, spec: str, as_json: bool) -> int:
    """The options model of one backend: each key, its type, default and description."""
    kind, _, name = spec.rpartition(":")
    kinds = [kind] if kind else [k for k in KINDS if name in registry.names(k)]
    if not kinds:
        known = sorted({n for k in KINDS for n in registry.names(k)})
        import difflib

        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise RollartError(f"no installed backend is named {name!r}{hint} (see `rollart plugins`)")
    if len(kinds) > 1:
        raise RollartError(f"{name!r} is a {' and a '.join(kinds)}; say which: "
                           + " or ".join(f"--options {k}:{name}" for k in kinds))
    desc = registry.get(kinds[0], name)
    model = desc.options_model()
    if as_json:
        print(json.dumps(model.model_json_schema(), indent=2))
        return 0
    table = Table(title=f"{desc.kind} {desc.name!r} options ({model.__module__}.{model.__name__})")
    for col in ("key", "type", "default", "description"):
        table.add_column(col)
    for key, field in model.model_fields.items():
        default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
        ann = field.annotation
        plain = isinstance(ann, type) and not getattr(ann, "__args__", None)
        annotation = ann.__name__ if plain and ann is not None else str(ann)
        table.add_row(key, escape(annotation.replace("typing.", "")), escape(default),
                      escape(field.description or ""))
    console.print(table)
    if not model.model_fields:
        console.print("(no options)")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plugins", help="list installed plugins and what they register")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--kind", choices=KINDS, help="only this kind of backend")
    p.add_argument("--options", metavar="[KIND:]NAME", help="print a backend's options model")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when a plugin is broken, in conflict, or a disable is a typo")
    p.set_defaults(func=cmd_plugins)
