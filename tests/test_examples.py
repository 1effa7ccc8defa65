"""Every example config validates against the installed plugins (the example plugin under
examples/custom_env runs its own tests: examples/ is in pytest's testpaths)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollart_sdk.testing.dists import run_cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("config", sorted(ROOT.glob("examples/*.yaml")), ids=lambda p: p.name)
def test_example_config_validates(config):
    res = run_cli("validate", str(config), cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"ok: {config}" in res.stdout or "is valid" in res.stdout
