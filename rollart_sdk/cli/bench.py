"""``rollart bench NAME [ARGS]``: run a benchmark; each one owns its arguments.

Benchmarks are a plugin kind (hook ``rollart_register_benchmarks``): the SDK's own come
from the first-party package ``rollart-benchmark-suite`` (plugins/benchmarks/), others
from their plugins (the torch engine registers ``engine``). ``rollart bench NAME --help``
is the benchmark's own help.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rollart_sdk.cli.output import console


def benchmarks() -> dict[str, str]:
    """name -> summary of every installed benchmark."""
    from rollart_sdk.plugins import get_registry

    registry = get_registry()
    return {name: registry.get("benchmark", name).summary for name in registry.names("benchmark")}


def cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    from rollart_sdk.plugins import get_registry

    if args.name is None or args.name in ("-h", "--help"):
        console.print("usage: rollart bench NAME [ARGS]   (rollart bench NAME --help)\n")
        listed = benchmarks()
        for name, summary in listed.items():
            console.print(f"  {name:<10} {summary}")
        _missing_suite(listed)
        return 0
    registry = get_registry()
    name = args.name
    # `rollart bench NAME --engine E` runs benchmark NAME-E when one is registered.
    engine = _option_value(rest, "--engine")
    if engine and f"{name}-{engine}" in registry.names("benchmark"):
        name = f"{name}-{engine}"
    desc = registry.get("benchmark", name)  # unknown: "did you mean", exit 2
    fn: Callable[[list[str]], int] = desc.load()
    return int(fn(rest) or 0)


def _missing_suite(listed: dict[str, str]) -> None:
    """Say how to get the SDK's own benchmarks when their package is not installed (or is
    disabled, or failed to import)."""
    from rollart_sdk.plugins import get_registry
    from rollart_sdk.registry import BENCHMARK_SUITE, install_hint

    missing = [n for n in BENCHMARK_SUITE if n not in listed]
    if missing:
        why = install_hint("benchmark", missing[0], get_registry().not_loaded)
        console.print(f"\n  not available: {', '.join(missing)} (the SDK's benchmarks). {why}",
                      highlight=False)


def _option_value(argv: list[str], option: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def add_parser(sub: Any) -> None:
    # No -h here: `rollart bench NAME --help` goes to the benchmark's own parser.
    p = sub.add_parser("bench", add_help=False,
                       help="run a benchmark (rollart bench: the list; NAME --help: its options)")
    p.add_argument("name", nargs="?", help="the benchmark (rollart bench lists them)")
    p.set_defaults(func=cmd_bench, takes_rest=True)
