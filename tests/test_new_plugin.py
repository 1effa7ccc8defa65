"""`rollart new-plugin KIND NAME DIR` writes a package that installs and passes its own
tests unchanged (the env one for real: pip install -e, entry point listed, pytest DIR)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollart_sdk.cli.new_plugin import KIND_HOOK
from rollart_sdk.testing.dists import overlay_venv, run_cli


def _pytest(target: Path, env: dict[str, str] | None = None,
            python: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python or sys.executable), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(target)],
        capture_output=True, text=True, cwd=target.parent, timeout=600,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.timeout(900)
def test_env_plugin_installs_registers_and_passes_its_tests(tmp_path):
    src = tmp_path / "src"
    res = run_cli("new-plugin", "env", "demo", str(src))
    assert res.returncode == 0, res.stderr
    (pkg,) = src.iterdir()
    assert pkg.name == "rollart-env-demo"
    # Installed into a venv over this environment, never into it: other test processes
    # (xdist) load plugins strictly and would see its entry point without its module.
    python = overlay_venv(tmp_path / "venv")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--no-deps",
           "--no-build-isolation", "-e", str(pkg)]
    installed = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-2000:]
    before = run_cli("plugins", "--json", "--kind", "env")
    assert "rollart-env-demo" not in {r["name"] for r in json.loads(before.stdout)}
    listed = run_cli("plugins", "--json", "--kind", "env", python=python)
    rec = {r["name"]: r for r in json.loads(listed.stdout)}["rollart-env-demo"]
    assert rec["status"] == "ok" and rec["registered"] == {"env": ["demo"]}
    tests = _pytest(src, python=python)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert "3 passed" in tests.stdout
    options = run_cli("plugins", "--options", "env:demo", python=python)
    assert "max_turns" in options.stdout


@pytest.mark.parametrize("kind", sorted(set(KIND_HOOK) - {"env"}))
def test_every_kind_template_passes_its_own_tests(tmp_path, kind):
    res = run_cli("new-plugin", kind, "demo", str(tmp_path))
    assert res.returncode == 0, res.stderr
    (pkg,) = tmp_path.iterdir()
    # Not installed (keeps the test environment's plugin set intact): on sys.path instead.
    tests = _pytest(pkg, env={"PYTHONPATH": str(pkg)})
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and "failed" not in tests.stdout


def test_bad_input_is_refused(tmp_path):
    res = run_cli("new-plugin", "env", "Bad-Name", str(tmp_path))
    assert res.returncode == 2 and "lower-case letters" in res.stderr
    assert run_cli("new-plugin", "env", "ok", str(tmp_path)).returncode == 0
    again = run_cli("new-plugin", "env", "ok", str(tmp_path))
    assert again.returncode == 2 and "not empty" in again.stderr
