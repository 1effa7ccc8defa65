"""Plugin loading: isolation of broken plugins, blocking, conflicts, misspelled hooks."""

from __future__ import annotations

import json

import pytest

from rollart_sdk.errors import PluginError, UnknownBackendError
from rollart_sdk.plugins import load_plugins
from rollart_sdk.testing.dists import make_dist, run_cli

GOOD = """
from rollart_sdk import hookimpl

@hookimpl
def rollart_register_envs(registry):
    registry.register("goodenv", factory="goodplug_env:Env", summary="a good env")
"""

BROKEN = """
import pathlib, os
pathlib.Path(os.environ["BROKEN_MARKER"]).write_text("imported")
raise RuntimeError("this plugin is broken on purpose")
"""


def test_builtins_register_through_hooks(rollart_plugins):
    rec = rollart_plugins.records["rollart-builtins"]
    assert rec.builtin and rec.error is None
    assert sorted(rollart_plugins.registry.names("placement")) == ["affinity", "pack", "spread"]
    assert "rollart_register_placements" in rec.hooks


def test_broken_plugin_recorded_and_others_work(fake_site, tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv("BROKEN_MARKER", str(marker))
    make_dist(fake_site, "goodplug", "goodplug", GOOD)
    make_dist(fake_site, "brokenplug", "brokenplug", BROKEN)
    ps = load_plugins(strict=False)
    assert "this plugin is broken on purpose" in ps.records["brokenplug"].error
    assert ps.registry.get("env", "goodenv").distribution == "goodplug"
    assert marker.exists()


def test_strict_mode_turns_import_failure_into_error(fake_site, tmp_path, monkeypatch):
    monkeypatch.setenv("BROKEN_MARKER", str(tmp_path / "m"))
    make_dist(fake_site, "brokenplug", "brokenplug", BROKEN)
    with pytest.raises(PluginError, match="brokenplug.*broken on purpose"):
        load_plugins(strict=True)


def test_disabled_plugin_is_never_imported(fake_site, tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv("BROKEN_MARKER", str(marker))
    monkeypatch.setenv("ROLLART_DISABLE_PLUGINS", "brokenplug, other")
    make_dist(fake_site, "brokenplug", "brokenplug", BROKEN)
    ps = load_plugins(strict=True)  # strict, yet no error: it was blocked before import
    assert ps.records["brokenplug"].disabled
    assert ps.records["brokenplug"].error is None
    assert not marker.exists()


def test_two_distributions_same_name_is_a_conflict_on_both_records(fake_site):
    make_dist(fake_site, "goodplug", "goodplug", GOOD)
    make_dist(fake_site, "rivalplug", "rivalplug", GOOD)
    ps = load_plugins(strict=False)  # loading goes on: the conflict is recorded, not raised
    for name in ("goodplug", "rivalplug"):
        rec = ps.records[name]
        assert rec.registered == {"env": ["goodenv"]}
        assert rec.status.startswith("conflict: env 'goodenv' is registered twice")
        assert "goodplug" in rec.status and "rivalplug" in rec.status
    # Only selecting the name fails, naming both plugins and the fix.
    with pytest.raises(PluginError) as exc:
        ps.registry.get("env", "goodenv")
    assert "goodplug" in str(exc.value) and "rivalplug" in str(exc.value)
    assert "ROLLART_DISABLE_PLUGINS=rivalplug" in str(exc.value)
    with pytest.raises(PluginError, match="registered twice"):
        load_plugins(strict=True)


def test_misspelled_hook_is_caught(register_plugin):
    from types import SimpleNamespace

    from rollart_sdk import hookimpl

    @hookimpl
    def rollart_register_enviroments(registry):  # typo on purpose
        registry.register("x", factory="x:y")

    ps = register_plugin(SimpleNamespace(rollart_register_enviroments=rollart_register_enviroments), name="typo")
    assert "rollart_register_enviroments" in ps.records["typo"].error
    assert "x" not in ps.registry.names("env")  # the misspelled hook registered nothing


def test_hook_with_fewer_arguments_is_allowed(register_plugin):
    calls = []

    def rollart_register_rewards():
        calls.append(1)

    ps = register_plugin({"rollart_register_rewards": rollart_register_rewards}, name="noargs")
    assert calls == [1] and ps.records["noargs"].error is None


def test_unknown_name_lists_installed_and_suggests_package(rollart_plugins):
    with pytest.raises(UnknownBackendError) as exc:
        rollart_plugins.registry.get("placement", "nope")
    assert "affinity, pack, spread" in str(exc.value)
    with pytest.raises(UnknownBackendError) as exc:
        rollart_plugins.registry.get("placement", "afinity")
    assert "did you mean 'affinity'?" in str(exc.value)
    with pytest.raises(UnknownBackendError) as exc:  # autoload off: torch is not loaded
        rollart_plugins.registry.get("engine", "torch")
    assert "rollart-engine-torch, which is not installed: pip install rollart-engine-torch" in str(
        exc.value)


def test_registration_is_lazy(register_plugin, tmp_path):
    # The factory module does not exist: registering must not import it; loading does.
    ps = register_plugin(
        {"rollart_register_engines": lambda registry: registry.register("lazy", factory="no_such_module_xyz:Engine")},
        name="lazy",
    )
    desc = ps.registry.get("engine", "lazy")
    with pytest.raises(PluginError, match="no_such_module_xyz"):
        desc.load()


def test_options_validated_by_backend_model(register_plugin):
    from pydantic import BaseModel, ConfigDict

    from rollart_sdk.errors import ConfigError

    class Opts(BaseModel):
        model_config = ConfigDict(extra="forbid")
        size: int = 1

    ps = register_plugin(
        {"rollart_register_engines": lambda registry: registry.register("e", factory=dict, options=Opts)},
        name="opts",
    )
    desc = ps.registry.get("engine", "e")
    assert desc.create({"size": 3}) == {"size": 3}
    with pytest.raises(ConfigError) as exc:
        desc.validate_options({"size": "big", "colour": 1}, where="engine.options")
    text = str(exc.value)
    assert "engine.options.size" in text and "engine.options.colour" in text
    assert "allowed keys: size" in text


def test_cli_plugins_json_lists_broken_plugin_and_still_works(fake_site, tmp_path):
    make_dist(fake_site, "goodplug", "goodplug", GOOD)
    make_dist(fake_site, "brokenplug", "brokenplug", BROKEN)
    res = run_cli("plugins", "--json", env={"BROKEN_MARKER": str(tmp_path / "m")})
    assert res.returncode == 0, res.stderr
    records = {r["name"]: r for r in json.loads(res.stdout)}
    assert "broken on purpose" in records["brokenplug"]["error"]
    assert records["goodplug"]["registered"] == {"env": ["goodenv"]}
    assert records["goodplug"]["version"] == "0.1.0"
