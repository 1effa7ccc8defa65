"""The ``rollart`` command line: one module per command (plugins, envs, validate, train, eval,
serve-reward, bench, report, samples, status, model, new-plugin, doctor); this module builds the parser and
runs the command."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from rollart_sdk.cli import (
    bench,
    doctor,
    envs,
    eval,
    model,
    new_plugin,
    plugins,
    report,
    samples,
    serve_reward,
    sim,
    status,
    train,
    validate,
)
from rollart_sdk.errors import RollartError

__all__ = ["build_parser", "main"]

# The commands, in the order `rollart --help` lists them.
COMMANDS = (plugins, envs, validate, train, eval, sim, serve_reward, bench, report, samples,
            status, model, new_plugin, doctor)


def dump_stacks_on_sigusr1() -> None:
    """``kill -USR1 PID`` makes a running ``rollart`` print, to stderr, every thread's
    Python stack and then every asyncio task's (where each coroutine of the control plane
    awaits), and go on: where a run that seems stuck (a stop that does not end, a step
    that never comes) waits. Only in the main thread, and where stderr is a file (not
    when ``main`` is called with stderr captured in memory); a no-op where there is no
    SIGUSR1 (Windows).

    The handler is Python's, run by the main thread between two bytecodes, with the
    interpreter's lock. ``faulthandler``'s C handler (used before) reads the
    other threads' frames while they run, and a CI run died of it (SIGSEGV) with the
    engine, env and trainer threads busy. A main thread blocked inside one C call prints
    once that call returns."""
    import io
    import signal
    import threading

    usr1 = getattr(signal, "SIGUSR1", None)
    if usr1 is None or threading.current_thread() is not threading.main_thread():
        return
    try:
        sys.stderr.fileno()
    except (io.UnsupportedOperation, AttributeError, ValueError):
        return  # stderr has no file descriptor: nowhere to write the stacks
    signal.signal(usr1, _print_stacks)


def _print_stacks(signum: int, frame: Any) -> None:
    """Every thread's Python stack (``faulthandler``'s layout), then the asyncio tasks'."""
    import threading
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    out = sys.stderr
    for ident, top in sys._current_frames().items():
        if ident == me:
            top = frame  # the interrupted frame, not this handler's
        label = "Current thread" if ident == me else "Thread"
        print(f"{label} {ident:#x} ({names.get(ident, '?')}) (most recent call first):",
              file=out)
        for fs in reversed(traceback.extract_stack(top) if top is not None else []):
            print(f'  File "{fs.filename}", line {fs.lineno} in {fs.name}', file=out)
        print(file=out)
    _print_asyncio_tasks(signum, frame)


def _print_asyncio_tasks(signum: int, frame: object) -> None:
    import asyncio

    loop = asyncio._get_running_loop()
    if loop is None:
        return
    tasks = asyncio.all_tasks(loop)
    print(f"asyncio: {len(tasks)} tasks", file=sys.stderr)
    for task in sorted(tasks, key=lambda t: t.get_name()):
        print(f"task {task.get_name()} (outermost first):", file=sys.stderr)
        for filename, lineno, name in await_chain(task.get_coro()):
            print(f'  File "{filename}", line {lineno} in {name}', file=sys.stderr)
    sys.stderr.flush()


def await_chain(coro: Any, limit: int = 24) -> list[tuple[str, int, str]]:
    """Where a task's coroutine waits: its frame, then the frame of what it awaits, and so
    on down to the innermost coroutine (``(file, line, function)`` each). ``Task.print_stack``
    shows only the outermost frame of a suspended task (``job/run.py::_main`` for every
    run), which says nothing about where the run waits."""
    out: list[tuple[str, int, str]] = []
    while coro is not None and len(out) < limit:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        out.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollart", description="Disaggregated agentic RL (ROLLART) from plugins."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def working_dir_importable() -> None:
    """The folder ``rollart`` runs from is importable, as under ``python -m``: a config's
    import strings (an agent's ``run: examples.agent_calc:run``) may name a module there.
    Appended to ``sys.path`` (an installed package wins over a same-named file there), and
    to ``PYTHONPATH`` for the processes the run starts (env workers, Ray's workers on this
    machine)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if cwd not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([*parts, cwd])


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # run as the command (tests call main(argv) and keep their own paths)
        working_dir_importable()
    argv = list(sys.argv[1:] if argv is None else argv)
    dump_stacks_on_sigusr1()
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
