"""``rollart doctor [CONFIG]``: does each installed plugin's stack work here, and if not,
the command that fixes it.

One line per plugin distribution: the packages of its stack (found vs expected), whether
every module its backends import imports (each probed in a subprocess with a timeout:
a broken native library cannot take the doctor down), and the fix (for vLLM, Megatron,
Mooncake and SGLang: ``bash scripts/install.sh --with NAME``). With CONFIG, only the
plugins providing the backends the config selects are checked, one verdict per backend, and
the exit status is 1 when one of them is not usable (not registered, or its stack broken);
without, it is 0 whatever the report says.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.markup import escape
from rich.table import Table

from rollart_sdk.cli.output import console


def selected_backends(cfg: Any) -> list[tuple[str, str, str]]:
    """(kind, name, where in the config) of every backend ``cfg`` selects."""
    out = [(kind, getattr(cfg, kind).name, kind)
           for kind in ("engine", "trainer", "transport", "placement")]
    for t in cfg.tasks:
        out.append(("env", t.env.name, f"tasks[{t.tag}].env"))
        out.append(("reward", t.reward.name, f"tasks[{t.tag}].reward"))
    out += [("sink", b.name, f"logging[{i}]") for i, b in enumerate(cfg.logging)]
    return list(dict.fromkeys(out))


def _distributions(cfg: Any, plugins: Any) -> set[str]:
    """The distributions providing the backends ``cfg`` selects (a config's check covers
    those only)."""
    out = set()
    for kind, name, _ in selected_backends(cfg):
        if name in plugins.registry.names(kind):
            out.add(plugins.registry.get(kind, name).origin)
    return out


def check_config(cfg: Any, plugins: Any, reports: list[Any]) -> list[dict[str, Any]]:
    """One verdict per backend ``cfg`` selects: usable, or the problems and the fix."""
    from rollart_sdk.doctor import HEAVY, install_command
    from rollart_sdk.errors import RollartError

    by_dist = {r.distribution: r for r in reports}
    out = []
    for kind, name, where in selected_backends(cfg):
        verdict: dict[str, Any] = {"kind": kind, "name": name, "where": where}
        try:
            desc = plugins.registry.get(kind, name)
        except RollartError as exc:
            heavy = HEAVY.get(f"rollart-{kind}-{name}")
            fix = install_command(heavy.backend) if heavy else None
            verdict.update(usable=False, problems=[str(exc)], fix=fix)
            out.append(verdict)
            continue
        rep = by_dist.get(desc.origin)
        problems = rep.problems(f"{kind}:{name}") if rep else []
        verdict.update(distribution=desc.origin, usable=not problems, problems=problems,
                       fix=rep.fix() if problems and rep else None)
        out.append(verdict)
    return out


def _stack_cell(rep: Any) -> str:
    parts = []
    for c in rep.packages:
        mark = "red" if c.problem else "green"
        exp = f" [dim]({escape(c.expected)})[/dim]" if c.expected else ""
        parts.append(f"[{mark}]{escape(c.dist)} {escape(c.found or 'missing')}[/{mark}]{exp}")
    return ", ".join(parts) or "-"


def _print_reports(reports: list[Any]) -> None:
    table = Table(title="rollart doctor: plugin stacks")
    for col in ("distribution", "version", "packages (found, expected)", "imports", "status"):
        table.add_column(col, no_wrap=col != "packages (found, expected)")
    for rep in reports:
        bad = [m for m, why in rep.imports.items() if why]
        imports = (f"[red]{escape(', '.join(bad))} failed[/red]" if bad
                   else f"{len(rep.imports)} ok" if rep.imports else "-")
        status = ("[green]ok[/green]" if not rep.problems() else
                  "[yellow]not installed[/yellow]" if rep.not_installed() else "[red]broken[/red]")
        table.add_row(rep.distribution, rep.version or "-", _stack_cell(rep), imports, status)
    console.print(table)
    for rep in reports:
        if rep.problems():
            console.print(f"[red]{escape(rep.distribution)}[/red]: "
                          + escape("; ".join(rep.problems())), soft_wrap=True)
            console.print(f"  fix: {escape(rep.fix() or '-')}", soft_wrap=True)


def _print_verdicts(config: str, verdicts: list[dict[str, Any]]) -> None:
    console.print(f"\n[bold]{escape(config)}[/bold] selects:")
    for v in verdicts:
        head = f"  {v['kind']} {v['name']!r}" + (f" ({v['where']})" if v["where"] != v["kind"] else "")
        if v["usable"]:
            console.print(f"{escape(head)} [green]usable[/green]")
            continue
        console.print(f"{escape(head)} [red]NOT usable[/red]: " + escape("; ".join(v["problems"])),
                      soft_wrap=True)
        if v.get("fix"):
            console.print(f"    fix: {escape(v['fix'])}", soft_wrap=True)


def cmd_doctor(args: argparse.Namespace) -> int:
    from rollart_sdk.doctor import check_plugins
    from rollart_sdk.plugins import get_plugins

    cfg = None
    if args.config:
        from rollart_sdk.config import load_config

        cfg, _ = load_config(args.config, args.overrides)
    plugins = get_plugins()
    only = _distributions(cfg, plugins) if cfg is not None else None
    reports = check_plugins(plugins, timeout_s=args.timeout, only=only)
    verdicts = check_config(cfg, plugins, reports) if cfg is not None else []
    if args.json:
        print(json.dumps({"plugins": [r.to_json() for r in reports],
                          **({"config": verdicts} if cfg is not None else {})}, indent=2))
    else:
        _print_reports(reports)
        if cfg is not None:
            _print_verdicts(args.config, verdicts)
    return 1 if any(not v["usable"] for v in verdicts) else 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("doctor", help="does each plugin's stack import here; what to run if not")
    p.add_argument("config", nargs="?", help="a run config: exit 1 when a backend it selects "
                   "is not usable here")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. engine.name=vllm")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="seconds each module import may take (default 120)")
    p.set_defaults(func=cmd_doctor)
