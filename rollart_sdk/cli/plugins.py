"""``rollart plugins``: the installed plugins, what each registers, and its status.

One line per plugin (``--details``: every name with its summary, and why names a plugin
knows are not registered here); backends that only model time for ``rollart sim`` (trait
``simulated``) in a table of their own. ``--kind KIND`` lists one kind only; ``--options NAME`` (``KIND:NAME`` when two kinds share
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


def _names(rec: Any, kind: str, names: list[str], details: bool) -> str:
    """What ``rec`` registers of ``kind``: one line (the name and its summary when it is
    the only one, else the names, or a count past a few), or with ``details`` one line
    per name with its summary."""
    if details:
        return "\n".join(f"{kind}: {name}  [dim]{escape(rec.summaries.get(f'{kind}:{name}', ''))}[/dim]"
                         for name in names)
    if len(names) == 1:
        return f"{kind}: {names[0]}  [dim]{escape(rec.summaries.get(f'{kind}:{names[0]}', ''))}[/dim]"
    if len(names) > 12:  # a plugin with many names (gem/...): rollart envs lists them
        where = "rollart envs" if kind == "env" else "--details"
        return f"{kind}: {len(names)} names, e.g. {names[0]} [dim]({where})[/dim]"
    return f"{kind}: {', '.join(names)}"


def _registrations(rec: Any, kinds: dict[str, list[str]], details: bool) -> str:
    if not details and sum(map(len, kinds.values())) > 1:  # one line: names, no summaries
        regs = "; ".join(f"{k}: {', '.join(v)}" if len(v) <= 12 else _names(rec, k, v, False)
                         for k, v in kinds.items())
    else:
        regs = "\n".join(_names(rec, kind, names, details) for kind, names in kinds.items())
    if rec.unavailable:  # names the plugin knows but could not register here
        regs += ("\n" if details else "  ") + (
            f"[yellow]+{len(rec.unavailable)} not registered[/yellow]")
    return regs or "-"


def _split(rec: Any, kind: str | None) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """``rec``'s registrations of ``kind`` (all kinds when None): (real, simulated)."""
    real: dict[str, list[str]] = {}
    sim: dict[str, list[str]] = {}
    for k, names in rec.registered.items():
        if kind and k != kind:
            continue
        for name in names:
            (sim if f"{k}:{name}" in rec.simulated else real).setdefault(k, []).append(name)
    return real, sim


def _table(title: str, rows: list[tuple[str, ...]], details: bool) -> Table:
    """Plugin, distribution, version and status whole; registers one line per plugin
    (cut with an ellipsis where the terminal is narrow) unless ``details``."""
    table = Table(title=title)
    for i, col in enumerate(("plugin", "distribution", "version", "registers", "status")):
        if col == "registers":
            table.add_column(col, no_wrap=not details, overflow="ellipsis")
        elif col == "status":  # an error's message in full
            table.add_column(col)
        else:
            table.add_column(col, no_wrap=True, min_width=max([len(col)] + [len(r[i]) for r in rows]))
    for row in rows:
        table.add_row(*row)
    return table


def _print_tables(records: list[Any], kind: str | None, details: bool) -> None:
    rows: list[tuple[str, ...]] = []
    sim_rows: list[tuple[str, ...]] = []
    for rec in records:
        real, sim = _split(rec, kind)
        head = (rec.name, rec.distribution or "-", rec.version or "-")
        if real or not sim:
            rows.append((*head, _registrations(rec, real, details), _status_markup(rec)))
        if sim:
            sim_rows.append((*head, _registrations(rec, sim, details), _status_markup(rec)))
    console.print(_table("rollart plugins" + (f" (kind {kind})" if kind else ""), rows, details))
    if sim_rows:
        console.print(_table("simulation backends (model time only: rollart sim, "
                             "clock: simulated)", sim_rows, details))
    for rec in records:  # a problem in full, on one line of its own
        if rec.error or rec.conflicts:
            console.print(f"[red]{escape(rec.name)}[/red]: {escape(rec.status)}", soft_wrap=True)
    for rec in records:
        if not rec.unavailable:
            continue
        if details:
            console.print(f"\n[bold]{rec.name}[/bold] does not register:")
            for name, reason in sorted(rec.unavailable.items()):
                console.print(f"  {name}: {escape(reason)}")
        else:
            console.print(f"{rec.name}: {len(rec.unavailable)} names known but not registered "
                          "here (`rollart plugins --details` says why)")


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
        _print_tables(records, args.kind, args.details)
    for warning in ps.warnings:
        err_console.print(f"[yellow]warning[/yellow]: {escape(warning)}")
    bad = [r for r in ps.records.values() if r.error or r.conflicts]
    return 1 if args.strict and (bad or ps.warnings) else 0


def _print_options(registry: Any, spec: str, as_json: bool) -> int:
    """The options model of one backend: each key, its type, default and description."""
    kind, _, name = spec.rpartition(":")
    kinds = [kind] if kind else [k for k in KINDS if name in registry.names(k)]
    if not kinds:
        from rollart_sdk.errors import closest

        known = sorted({n for k in KINDS for n in registry.names(k)})
        close = closest(name, known, n=3)
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
    p.add_argument("--options", metavar="[KIND:]NAME",
                   help="print a backend's options model: key, type, default, description")
    p.add_argument("--details", action="store_true",
                   help="every registered name with its summary, and why known names are not "
                   "registered (default: one line per plugin)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when a plugin is broken, in conflict, or a disable is a typo")
    p.set_defaults(func=cmd_plugins)
