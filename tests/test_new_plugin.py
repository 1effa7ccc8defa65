"""`rollart new-plugin KIND NAME DIR` writes a package into DIR (the package folder) that
installs and passes its own tests unchanged (the env one for real: pip install -e, entry
point listed, pytest DIR). The templates are real files (rollart_sdk/templates), renamed
when rendered and shipped in the wheel."""

from __future__ import annotations

import glob
import importlib
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rollart_sdk.cli.new_plugin import KIND_HOOK, render
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
    pkg = tmp_path / "src"
    res = run_cli("new-plugin", "env", "demo", str(pkg))
    assert res.returncode == 0, res.stderr
    assert (pkg / "pyproject.toml").is_file() and (pkg / "rollart_env_demo" / "env.py").is_file()
    assert f"wrote {pkg} (the package rollart-env-demo)" in res.stdout
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
    tests = _pytest(pkg, python=python)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert "3 passed" in tests.stdout
    options = run_cli("plugins", "--options", "env:demo", python=python)
    assert "max_replies" in options.stdout and "max_turns" not in options.stdout
    # The template registers traits: the turns and character columns of `rollart envs`.
    envs = json.loads(run_cli("envs", "--json", "demo", python=python).stdout)
    assert envs[0]["turns"] == "max_replies (default 3)" and "multi-turn" in envs[0]["character"]


@pytest.mark.parametrize("kind", sorted(set(KIND_HOOK) - {"env"}))
def test_every_kind_template_passes_its_own_tests(tmp_path, kind):
    pkg = tmp_path / "pkg"
    res = run_cli("new-plugin", kind, "demo", str(pkg))
    assert res.returncode == 0, res.stderr
    # Not installed (keeps the test environment's plugin set intact): on sys.path instead,
    # before the path this session imports rollart_sdk from (its SDK is the one tested).
    path = os.pathsep.join(p for p in (str(pkg), os.environ.get("PYTHONPATH")) if p)
    tests = _pytest(pkg, env={"PYTHONPATH": path})
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and "failed" not in tests.stdout


def test_dir_is_the_package_folder_default_named_after_the_package(tmp_path):
    """DIR is the folder that becomes the package (as README and docs say); without DIR
    it is ./rollart-KIND-NAME; an empty existing folder is used as it is."""
    assert run_cli("new-plugin", "reward", "partial", cwd=tmp_path).returncode == 0
    assert (tmp_path / "rollart-reward-partial" / "pyproject.toml").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli("new-plugin", "env", "game", str(empty)).returncode == 0
    assert sorted(p.name for p in empty.iterdir()) == [
        "README.md", "pyproject.toml", "rollart_env_game", "tests"]
    help_text = run_cli("new-plugin", "--help").stdout
    assert "the package folder to create" in help_text


def test_bad_input_is_refused(tmp_path):
    res = run_cli("new-plugin", "env", "Bad-Name", str(tmp_path / "x"))
    assert res.returncode == 2 and "lower-case letters" in res.stderr
    assert run_cli("new-plugin", "env", "ok", str(tmp_path / "ok")).returncode == 0
    again = run_cli("new-plugin", "env", "ok", str(tmp_path / "ok"))
    assert again.returncode == 2 and "not empty" in again.stderr and "package folder" in again.stderr
    (tmp_path / "file").write_text("")
    onto_file = run_cli("new-plugin", "env", "ok", str(tmp_path / "file"))
    assert onto_file.returncode == 2 and "is a file" in onto_file.stderr


def test_a_name_an_installed_plugin_registers_is_refused(tmp_path):
    """`rollart new-plugin env guess` next to rollart-env-arithmetic (which registers env
    `guess`): its own tests would pass and every config selecting `guess` would then
    fail as "registered twice"; refused up front, naming the owner; --force writes it."""
    res = run_cli("new-plugin", "env", "guess", str(tmp_path / "g"))
    assert res.returncode == 2 and not (tmp_path / "g").exists(), res.stderr
    err = " ".join(res.stderr.split())
    assert "env 'guess' is already registered by rollart-env-arithmetic" in err, err
    assert "--force" in err
    forced = run_cli("new-plugin", "env", "guess", str(tmp_path / "g"), "--force")
    assert forced.returncode == 0 and (tmp_path / "g" / "rollart_env_guess").is_dir()
    # a reward of that name is free: kinds are separate namespaces
    assert run_cli("new-plugin", "reward", "guess", str(tmp_path / "r")).returncode == 0


def test_env_template_option_is_not_a_task_key():
    """The env template's own turn limit is not named like tasks[].max_turns."""
    from rollart_sdk.config import TaskConfig

    env_py = render("env", "demo")["rollart_env_demo/env.py"]
    fields = {line.split(":")[0].strip() for line in env_py.splitlines()
              if line.startswith("    ") and ": " in line and "= Field(" in line}
    assert fields == {"max_replies"} and not fields & set(TaskConfig.model_fields)


TEMPLATES = Path(__file__).resolve().parents[1] / "rollart_sdk" / "templates"


@pytest.mark.parametrize("kind", sorted(KIND_HOOK))
def test_rendering_renames_every_placeholder(kind):
    """The template is the kind's plugin named ``example``; a rendered package keeps no
    trace of that name (identifiers, paths, prose) and holds the files it always held."""
    files = render(kind, "my_game")
    package = f"rollart_{kind}_my_game"
    module = KIND_HOOK[kind][1]
    assert set(files) == {"pyproject.toml", "README.md", f"{package}/__init__.py",
                          f"{package}/py.typed", f"{package}/plugin.py",
                          f"{package}/{module}", "tests/test_my_game.py"}
    for path, text in files.items():
        assert not re.search("example", path + text, flags=re.IGNORECASE), (
            f"{kind}: {path} still says 'example'")
    for path in ("pyproject.toml", "README.md"):  # the files with {placeholders}
        assert not re.search(r"\{[a-z]+\}", files[path]), f"{kind}: {path}: a placeholder left"
    cls = "MyGame" + KIND_HOOK[kind][2]
    assert f'factory="{package}.{module[:-3]}:{cls}"' in files[f"{package}/plugin.py"]
    assert f'options="{package}.{module[:-3]}:MyGameOptions"' in files[f"{package}/plugin.py"]
    assert f"def {KIND_HOOK[kind][0]}(" in files[f"{package}/plugin.py"]
    assert 'name = "rollart-' + kind.replace("_", "-") + '-my-game"' in files["pyproject.toml"]


def test_every_template_file_ships_in_the_wheel():
    """rollart_sdk/templates is not a package: its files reach the wheel only through
    pyproject's package-data, so every one must match a pattern there."""
    data = tomllib.loads((TEMPLATES.parents[1] / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["rollart_sdk"]
    shipped = {path for pat in patterns
               for path in glob.glob(pat, root_dir=TEMPLATES.parent, recursive=True)}
    files = [str(p.relative_to(TEMPLATES.parent)) for p in TEMPLATES.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]
    assert len(files) > 40  # guards the walk itself
    missing = sorted(set(files) - shipped)
    assert not missing, (f"not in [tool.setuptools.package-data] rollart_sdk: {missing}; "
                         "add a pattern for them")


def test_env_template_runs_its_kit_in_place():
    """The template folder is itself the package folder of a working plugin: importable
    as it stands and conforming to its kind's kit."""
    from rollart_sdk.testing.env import check_env

    sys.path.insert(0, str(TEMPLATES / "rollart-env-example"))
    try:
        env_module = importlib.import_module("rollart_env_example.env")
        check_env(env_module.ExampleEnv, seed=0)
    finally:
        sys.path.remove(str(TEMPLATES / "rollart-env-example"))
        for name in [m for m in sys.modules if m.startswith("rollart_env_example")]:
            del sys.modules[name]
