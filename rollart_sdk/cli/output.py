"""Consoles shared by the commands (stdout for results, stderr for warnings and errors)."""

from __future__ import annotations

from rich.console import Console


def _console(stderr: bool = False) -> Console:
    c = Console(stderr=stderr)
    if not c.is_terminal:  # piped or captured: do not wrap messages at 80 columns
        c = Console(stderr=stderr, width=200)
    return c


console = _console()
err_console = _console(stderr=True)
