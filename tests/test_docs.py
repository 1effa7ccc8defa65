"""docs/plugins.md stays complete and true: every hook and kit documented, every file it
quotes identical to the file in the repository, and its example plugin working."""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

import pytest

from rollart_sdk import hookspecs
from rollart_sdk.registry import import_string

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "plugins.md"
TESTING = ROOT / "rollart_sdk" / "testing"
EXAMPLE = ROOT / "examples" / "custom_env"
# Modules of rollart_sdk.testing that are pytest plumbing or internal test helpers, not kits.
NOT_KITS = {"__init__.py", "pytest_plugin.py", "dists.py"}


def _headings() -> set[str]:
    return set(re.findall(r"^### `?([\w.]+)`?\s*$", DOC.read_text(), flags=re.MULTILINE))


def _hook_names() -> list[str]:
    names = {
        name
        for name, obj in inspect.getmembers(hookspecs, inspect.isfunction)
        if name.startswith("rollart_")
    }
    return sorted(names | set(hookspecs.KIND_HOOKS.values()))


def _kit_names() -> list[tuple[str, str]]:
    """(module file, name) of each kit: public ``check_*`` functions and ``__all__`` entries."""
    found: list[tuple[str, str]] = []
    for path in sorted(TESTING.glob("*.py")):
        if path.name in NOT_KITS:
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
                "check_"
            ):
                found.append((path.name, node.name))
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                found += [(path.name, elt.value) for elt in node.value.elts]  # type: ignore[attr-defined]
    return sorted(set(found))


def test_hooks_are_found():
    assert "rollart_register_envs" in _hook_names()  # guards the discovery itself


@pytest.mark.parametrize("hook", _hook_names())
def test_every_hook_is_documented(hook):
    assert hook in _headings(), f"docs/plugins.md has no '### {hook}' section; add one"


def test_kits_are_found():
    names = {name for _, name in _kit_names()}
    assert {"check_env", "check_reward"} <= names  # guards the discovery itself


@pytest.mark.parametrize(("module", "kit"), _kit_names())
def test_every_kit_is_documented(module, kit):
    assert kit in _headings(), (
        f"rollart_sdk/testing/{module} exports {kit!r} but docs/plugins.md has no "
        f"'### {kit}' section; add one to the Reference"
    )


def _quoted_files() -> list[tuple[str, str]]:
    pattern = re.compile(r'^```\w+ title="([^"]+)"\n(.*?)^```$', re.MULTILINE | re.DOTALL)
    return pattern.findall(DOC.read_text())


def test_walkthrough_quotes_the_example_files():
    quoted = dict(_quoted_files())
    assert {
        "examples/custom_env/pyproject.toml",
        "examples/custom_env/rollart_env_guess/plugin.py",
        "examples/custom_env/rollart_env_guess/env.py",
        "examples/custom_env/tests/test_guess.py",
    } <= set(quoted)


@pytest.mark.parametrize(("path", "text"), _quoted_files())
def test_quoted_file_matches_the_repository(path, text):
    actual = (ROOT / path).read_text()
    assert text.rstrip() == actual.rstrip(), (
        f"docs/plugins.md quotes {path} but the file differs; paste the file into the doc "
        "(or change both)"
    )


@pytest.fixture
def example_on_path(monkeypatch):
    """Import the example plugin from its folder (nothing is pip-installed)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield
    for name in [m for m in sys.modules if m.startswith("rollart_env_guess")]:
        sys.modules.pop(name)


def test_example_env_passes_check_env(example_on_path):
    from rollart_sdk.testing.env import check_env

    env_module = __import__("rollart_env_guess.env", fromlist=["GuessEnv"])
    check_env(env_module.GuessEnv, seed=0)
    check_env(lambda: env_module.GuessEnv(low=-5, high=5, max_guesses=3), seed=4)


def test_example_entry_point_and_registration_resolve(example_on_path, register_plugin):
    import tomllib

    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    ((ep_name, ep_module),) = project["entry-points"]["rollart"].items()
    assert ep_name == project["name"] == "rollart-env-guess"
    plugin = __import__(ep_module, fromlist=["_"])
    desc = register_plugin(plugin, name=ep_name).registry.get("env", "guess")
    assert isinstance(desc.factory, str) and isinstance(desc.options, str)
    assert callable(import_string(desc.factory)) and desc.options_model().__name__ == "GuessOptions"
    env = desc.create({"high": 3})
    obs, _ = env.reset(seed=0)
    assert obs == "Guess a number between 1 and 3."
