"""Every option of every first-party plugin (each ``rollart-*`` package under plugins/ and
the SDK's built-ins) has a real description, shown by ``rollart plugins --options``, and no
env or reward option has the name of a task key (``tasks[].max_turns`` and an env option
``max_turns`` would read as one setting while being two)."""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
from pathlib import Path

import pytest

from rollart_sdk.config import TaskConfig
from rollart_sdk.plugins import load_plugins

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(ROOT.glob("plugins/*/rollart-*/pyproject.toml"))
# A description that sends the reader elsewhere instead of saying what the option does.
PLACEHOLDER = re.compile(r"^\s*$|see (the )?(module|docs?|readme|source)|\btodo\b|\bfixme\b|^\W+$",
                         re.IGNORECASE)


def _entry_points(pyproject: Path) -> dict[str, str]:
    meta = tomllib.loads(pyproject.read_text())
    return meta["project"].get("entry-points", {}).get("rollart", {})


def _descriptors(pyproject: Path | None) -> list:
    """What one plugin package (None: the SDK's built-ins) registers, loaded from its
    entry-point modules without installing it (megatron and mooncake are not installed in
    the test environment: their folder goes on sys.path for the import)."""
    if pyproject is None:
        ps = load_plugins(autoload=False, strict=True)
        return [d for d in ps.registry.all() if d.distribution in (None, "rollart-sdk")]
    if str(pyproject.parent) not in sys.path:
        sys.path.append(str(pyproject.parent))
    extra = {name: importlib.import_module(target.split(":")[0])
             for name, target in _entry_points(pyproject).items()}
    assert extra, f"{pyproject}: no [project.entry-points.rollart]"
    ps = load_plugins(autoload=False, extra=extra, strict=True)
    return [d for d in ps.registry.all() if d.plugin in extra]


def _ids(p: Path | None) -> str:
    return "builtins" if p is None else p.parent.name


def test_every_first_party_package_is_covered():
    names = {p.parent.name for p in PACKAGES}
    assert {"rollart-trainer-torch", "rollart-reward-rule", "rollart-env-frozenlake"} <= names
    assert len(names) >= 15


@pytest.mark.parametrize("pyproject", [None, *PACKAGES], ids=_ids)
def test_every_option_has_a_description(pyproject):
    bad = []
    models = {}
    for desc in _descriptors(pyproject):
        model = desc.options_model()
        models.setdefault(model, f"{desc.kind}:{desc.name}")
    assert models, f"{_ids(pyproject)} registers nothing"
    for model, who in models.items():
        for key, field in model.model_fields.items():
            if PLACEHOLDER.search(field.description or ""):
                bad.append(f"{who} option {key!r} ({model.__module__}.{model.__name__}): "
                           f"description {field.description!r}")
    assert not bad, ("options without a real description (give each a "
                     "Field(description=...) saying what it does):\n  " + "\n  ".join(bad))


@pytest.mark.parametrize("pyproject", [None, *PACKAGES], ids=_ids)
def test_no_env_or_reward_option_is_named_like_a_task_key(pyproject):
    task_keys = set(TaskConfig.model_fields)
    clashes = sorted(
        f"{d.kind}:{d.name} option {key!r} (tasks[].{key} is a task key)"
        for d in _descriptors(pyproject) if d.kind in ("env", "reward")
        for key in d.options_model().model_fields if key in task_keys
    )
    assert not clashes, "rename these options: " + "; ".join(clashes)


def test_placeholder_pattern_catches_what_it_should():
    for text in ("", "  ", "where the score comes from (see module doc)", "TODO", "see docs"):
        assert PLACEHOLDER.search(text), text
    for text in ("AdamW learning rate", "PPO clip range, lower side"):
        assert not PLACEHOLDER.search(text), text
