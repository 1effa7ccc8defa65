"""Every example config validates against the installed plugins (the example plugin under
examples/custom_env runs its own tests: examples/ is in pytest's testpaths)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollart_sdk.testing.dists import run_cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("config", sorted(ROOT.glob("examples/*.yaml")), ids=lambda p: p.name)
def test_example_config_validates(config):
    res = run_cli("validate", str(config), cwd=ROOT, timeout=300)  # a loaded CI machine
    if res.returncode != 0 and "which is not installed: pip install" in res.stderr:
        # A first-party plugin with its own stack (a ci.sh) that this environment lacks.
        pytest.skip(res.stderr.strip().splitlines()[-1])
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"ok: {config}" in res.stdout or "is valid" in res.stdout


def test_minimal_example_is_one_task_and_validates_without_warnings():
    """examples/minimal.yaml, the start docs/plugins.md points to: one task, and no
    warning at all (no fallback workers, no sampling or precision notes)."""
    import yaml

    config = ROOT / "examples" / "minimal.yaml"
    assert len(yaml.safe_load(config.read_text())["tasks"]) == 1
    res = run_cli("validate", str(config), cwd=ROOT, timeout=300)  # a loaded CI machine
    assert res.returncode == 0, res.stdout + res.stderr
    assert "is valid" in res.stdout
    assert "warning" not in (res.stdout + res.stderr).lower()
    assert "examples/minimal.yaml" in (ROOT / "docs" / "plugins.md").read_text()


def test_first_plugins_walkthrough_config_resolves_with_its_plugins():
    """examples/first_plugins/hilo.yaml (docs/plugins.md, "Your first env and reward
    plugin") resolves against the two packages written there, loaded as plugins without
    installing them, with no option-name clash warning."""
    import importlib
    import sys

    from rollart_sdk.config import load_config
    from rollart_sdk.config.resolve import resolve_run
    from rollart_sdk.job.preflight import option_clash_warnings
    from rollart_sdk.plugins import load_plugins

    folder = ROOT / "examples" / "first_plugins"
    extra = {}
    for dist, module in (("rollart-env-hilo", "rollart_env_hilo.plugin"),
                         ("rollart-reward-closeness", "rollart_reward_closeness.plugin")):
        sys.path.insert(0, str(folder / dist))
        try:
            extra[dist] = importlib.import_module(module)
        finally:
            sys.path.remove(str(folder / dist))
    registry = load_plugins(autoload=True, extra=extra, strict=False).registry
    cfg, lines = load_config(folder / "hilo.yaml")
    resolved = resolve_run(cfg, registry, lines, in_process=True)
    env = resolved.envs["HiLo"].create()
    assert env.action_vocabulary == [str(d) for d in range(10)]
    assert resolved.rewards["HiLo"].descriptor.name == "closeness"
    assert cfg.tasks[0].max_turns >= env.options.max_guesses
    assert option_clash_warnings(cfg, resolved) == []
