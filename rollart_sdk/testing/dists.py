"""Helpers for testing plugin discovery for real: fake installed distributions and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path


def make_dist(site: Path, dist: str, module: str, source: str, entry: str | None = None) -> Path:
    """Install a real (minimal) distribution into ``site``: a module plus a .dist-info with
    an entry point in group ``rollart``; importlib.metadata finds it via sys.path."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[rollart]\n{entry or dist} = {module}\n")
    return site


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            python: str | Path | None = None, timeout: float = 120):
    """Run the real `rollart` CLI in a subprocess (under ``python``, this interpreter by
    default), as the ``rollart`` command runs: ``PYTHONSAFEPATH`` keeps ``-m`` from putting
    the working directory first on ``sys.path`` (the console script does not either)."""
    full_env = dict(os.environ)
    full_env["PYTHONSAFEPATH"] = "1"
    full_env.update(env or {})
    return subprocess.run(
        [str(python or sys.executable), "-m", "rollart_sdk.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
    )


def overlay_venv(where: Path) -> Path:
    """A venv at ``where`` that sees this interpreter's packages (--system-site-packages,
    pip included) but installs into its own site-packages; returns its python. A test that
    pip-installs a plugin does it there: installing into the shared environment would show
    the new entry point to every other test process at once, while its editable finder
    (a .pth, read only at interpreter start) is missing from them."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(where)], check=True, capture_output=True, timeout=120)
    python = where / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"venv at {where} has no bin/python")
    return python
