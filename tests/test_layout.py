"""The repository's shape, held by a machine: typed packages, honest install hints, hooks
documented with their real signatures and each exercised by a test."""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import pytest

from rollart_sdk import hookspecs
from rollart_sdk.interfaces import KINDS
from rollart_sdk.registry import FIRST_PARTY

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_PROJECTS = sorted(ROOT.glob("plugins/*/*/pyproject.toml"))


def test_first_party_hints_name_only_packages_in_this_repository():
    for (kind, name), dist in FIRST_PARTY.items():
        folder = ROOT / "plugins" / f"{kind}s" / dist
        assert (folder / "pyproject.toml").exists(), (
            f"registry.FIRST_PARTY says {dist} provides {kind} {name!r}, but {folder} does "
            "not exist; hint only at packages this repository ships"
        )
        project = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
        assert project["name"] == dist


def _top_package(pyproject: Path) -> str:
    include = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["packages"]["find"]
    return include["include"][0].rstrip("*")


@pytest.mark.parametrize("pyproject", [ROOT / "pyproject.toml", *PLUGIN_PROJECTS],
                         ids=lambda p: p.parent.name)
def test_every_package_is_typed_and_ships_py_typed(pyproject):
    package = _top_package(pyproject)
    assert (pyproject.parent / package / "py.typed").exists(), f"{package}/py.typed missing"
    data = tomllib.loads(pyproject.read_text())["tool"]["setuptools"].get("package-data", {})
    assert "py.typed" in data.get(package, []), (
        f"{pyproject}: add [tool.setuptools.package-data] {package} = [\"py.typed\"]"
    )


def test_kinds_come_from_the_hookspecs():
    specs = {name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
             if name.startswith("rollart_register_")}
    assert set(hookspecs.KIND_HOOKS.values()) == specs
    assert KINDS == tuple(hookspecs.KIND_HOOKS)


DOC = (ROOT / "docs" / "plugins.md").read_text()


@pytest.mark.parametrize("hook", sorted(hookspecs.KIND_HOOKS.values()))
def test_documented_hook_signature_matches_the_spec(hook):
    """datasette's check: the signature docs/plugins.md shows is the spec's."""
    section = DOC.split(f"### {hook}\n", 1)[1]
    shown = re.search(r"def (\w+)\((.*?)\) -> (\w+): \.\.\.", section)
    assert shown and shown.group(1) == hook, f"docs/plugins.md: no signature under ### {hook}"
    spec = getattr(hookspecs, hook)
    params = ", ".join(f"{n}: {p.annotation}" for n, p in inspect.signature(spec).parameters.items())
    assert shown.group(2) == params, f"{hook}: docs show ({shown.group(2)}), spec is ({params})"
    assert shown.group(3) == str(inspect.signature(spec).return_annotation)


TEST_SOURCES = "\n".join(p.read_text() for p in [*ROOT.glob("tests/**/*.py"),
                                                 *ROOT.glob("plugins/*/*/tests/*.py")])


@pytest.mark.parametrize("hook", sorted(hookspecs.KIND_HOOKS.values()))
def test_every_hook_has_a_test(hook):
    """datasette's other check: each hook is implemented somewhere a test exercises it
    (a registration the tests load: a plugin's plugin.py or a built-in) and named in a test."""
    implemented = [p for p in [*ROOT.glob("plugins/*/*/*/plugin.py"),
                               *ROOT.glob("rollart_sdk/default_plugins/*.py")]
                   if f"def {hook}(" in p.read_text()]
    assert implemented, f"no plugin implements {hook}"
    kind = next(k for k, h in hookspecs.KIND_HOOKS.items() if h == hook)
    # Named in a test, or a test looks up what it registers (registry.get / names of the
    # kind); the kind's bare name in quotes is not enough ("trainer" is in many tests).
    looked_up = re.search(rf'\.(get|names)\(\s*"{kind}"', TEST_SOURCES)
    assert hook in TEST_SOURCES or looked_up, f"no test calls or looks up {hook}"
