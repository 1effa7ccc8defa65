"""Plugin manager: entry-point loading with broken plugins isolated, then registration.

Loading rules (what users rely on):

- every distribution exposing an entry point in group ``rollart`` is imported; one whose
  import raises is recorded with its error and skipped (``ROLLART_STRICT_PLUGINS=1``
  turns that into an error);
- ``ROLLART_DISABLE_PLUGINS=a,b`` blocks plugins by entry-point name before import;
- a hook implementation whose name matches no hook (a typo) is caught by pluggy's
  ``check_pending`` and that plugin is skipped with the error recorded;
- a name in ``ROLLART_DISABLE_PLUGINS`` that no plugin has is reported (``warnings``,
  with "did you mean");
- the built-in defaults (``rollart_sdk.default_plugins``) register through the same hooks
  as third-party plugins;
- two plugins registering the same name for the same kind is a conflict recorded on both
  plugins' records; a run selecting that name fails with a message naming both;
- every hook is called through pluggy (``pm.hook``, one plugin at a time so each
  registration carries its plugin's name): ``ROLLART_TRACE_HOOKS=1`` prints each call and
  what the plugin registered.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

import pluggy

from rollart_sdk import hookspecs
from rollart_sdk.errors import PluginError
from rollart_sdk.registry import Registrar, Registry

ENTRY_POINT_GROUP = "rollart"
# Built-in defaults, registered like any plugin (name -> module).
DEFAULT_PLUGINS: dict[str, str] = {
    "rollart-builtins": "rollart_sdk.default_plugins.placements",
    "rollart-builtins-transports": "rollart_sdk.default_plugins.transports",
    "rollart-builtins-serverless": "rollart_sdk.default_plugins.serverless",
    "rollart-builtins-sims": "rollart_sdk.default_plugins.sims",
    "rollart-builtins-envs": "rollart_sdk.default_plugins.envs",
}


@dataclass
class PluginRecord:
    """One plugin as `rollart plugins` shows it."""

    name: str
    distribution: str | None
    version: str | None
    module: str
    builtin: bool = False
    registered: dict[str, list[str]] = field(default_factory=dict)  # kind -> names
    summaries: dict[str, str] = field(default_factory=dict)  # "kind:name" -> summary
    unavailable: dict[str, str] = field(default_factory=dict)  # "kind:name" -> why not registered
    # "kind:name" of backends that only model time for `rollart sim` (traits simulated).
    simulated: list[str] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)
    error: str | None = None
    disabled: bool = False
    conflicts: list[str] = field(default_factory=list)  # one message per conflicting name

    @property
    def status(self) -> str:
        """The CLI's word for this plugin: ok, disabled, failed to import/register, conflict."""
        if self.disabled:
            return "disabled (ROLLART_DISABLE_PLUGINS)"
        if self.error:
            return self.error
        if self.conflicts:
            return "conflict: " + "; ".join(self.conflicts)
        return "ok"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "module": self.module,
            "builtin": self.builtin,
            "hooks": self.hooks,
            "registered": self.registered,
            "summaries": self.summaries,
            "unavailable": self.unavailable,
            "simulated": self.simulated,
            "error": self.error,
            "disabled": self.disabled,
            "conflicts": self.conflicts,
            "status": self.status,
        }


@dataclass
class PluginSet:
    """The loaded plugins: the pluggy manager, the registry and one record per plugin."""

    pm: pluggy.PluginManager
    registry: Registry
    records: dict[str, PluginRecord]
    warnings: list[str] = field(default_factory=list)

    @property
    def errors(self) -> dict[str, str]:
        return {n: r.error for n, r in self.records.items() if r.error}


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if os.environ.get("ROLLART_TRACE_HOOKS"):
        pm.trace.root.setwriter(lambda text: print(text, end="", file=sys.stderr))
        pm.enable_tracing()
    return pm


def _env_list(var: str) -> set[str]:
    return {x.strip() for x in os.environ.get(var, "").split(",") if x.strip()}


def _strict() -> bool:
    return os.environ.get("ROLLART_STRICT_PLUGINS", "") not in ("", "0", "false", "no")


def _register_module(
    pm: pluggy.PluginManager, module: ModuleType | object, record: PluginRecord
) -> bool:
    """Register one plugin object; on a misspelled hook, unregister it and record why."""
    try:
        pm.register(module, name=record.name)
        pm.check_pending()
    except Exception as exc:  # noqa: BLE001 - pluggy raises PluginValidationError and others
        if pm.is_registered(module):
            pm.unregister(module)
        record.error = f"has invalid hooks: {type(exc).__name__}: {exc}"
        return False
    record.hooks = sorted(h.name for h in pm.get_hookcallers(module) or [])
    return True


_Candidate = tuple[str, str | None, str | None, str, Any]  # name, dist, version, module, source


def _candidates(autoload: bool, extra: dict[str, ModuleType | object] | None) -> list[_Candidate]:
    """Built-ins, then entry points (sorted by name), then ``extra``; first of a name wins."""
    out: list[_Candidate] = []
    for name, mod in DEFAULT_PLUGINS.items():
        out.append((name, "rollart-sdk", _dist_version("rollart-sdk"), mod, None))
    if autoload:
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist else None
            ver = ep.dist.version if ep.dist else None
            out.append((ep.name, dist, ver, ep.value, ep))
    for name, obj in (extra or {}).items():
        out.append((name, None, None, getattr(obj, "__name__", repr(obj)), obj))
    return out


def _import(modname: str, source: Any) -> ModuleType | object:
    if source is None:
        return importlib.import_module(modname)
    if hasattr(source, "load") and hasattr(source, "group"):  # an entry point
        return source.load()
    try:
        hash(source)
    except TypeError:  # e.g. a SimpleNamespace of hooks: pluggy needs hashable plugins
        module = ModuleType(modname)
        module.__dict__.update(vars(source))
        return module
    return source


def _import_and_register(pm: pluggy.PluginManager, record: PluginRecord, source: Any,
                         strict: bool) -> None:
    try:
        module = _import(record.module, source)
    except Exception as exc:
        record.error = f"failed to import: {type(exc).__name__}: {exc}"
        if strict:
            raise PluginError(f"plugin {record.name!r} {record.error}") from exc
        return
    if not _register_module(pm, module, record) and strict:
        raise PluginError(f"plugin {record.name!r} is invalid: {record.error}")


def _disable_warnings(disabled: set[str], records: dict[str, PluginRecord]) -> list[str]:
    """A name in ROLLART_DISABLE_PLUGINS that matches no plugin is probably a typo."""
    import difflib

    out = []
    for name in sorted(disabled - set(records)):
        close = difflib.get_close_matches(name, list(records), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; plugins: {', '.join(records)}"
        out.append(f"ROLLART_DISABLE_PLUGINS names {name!r}, which is no installed plugin{hint}")
    return out


def _call_registration_hooks(pm: pluggy.PluginManager, records: dict[str, PluginRecord],
                             registry: Registry, strict: bool) -> None:
    """Call each kind's hook through pluggy, one plugin at a time (a subset hook caller),
    so every registration carries its plugin's name and pluggy's tracing sees the call."""
    tracing = bool(os.environ.get("ROLLART_TRACE_HOOKS"))
    plugins = dict(pm.list_name_plugin())
    for kind, hook_name in hookspecs.KIND_HOOKS.items():
        caller = getattr(pm.hook, hook_name)
        for impl in caller.get_hookimpls():
            record = records[impl.plugin_name]
            others = [p for n, p in plugins.items() if n != impl.plugin_name and p is not None]
            only_this = pm.subset_hook_caller(hook_name, remove_plugins=others)
            registrar = Registrar(kind, registry, record.name, record.distribution, record.version)
            before = len(registry.all()) + sum(map(len, registry.conflicts.values()))
            try:
                only_this(registry=registrar)
            except Exception as exc:
                record.error = f"failed in {hook_name}: {type(exc).__name__}: {exc}"
                if strict:
                    raise PluginError(f"plugin {record.name!r}: {record.error}") from exc
            if tracing:
                after = len(registry.all()) + sum(map(len, registry.conflicts.values()))
                names = [d.name for d in registry.all() if d.plugin == record.name
                         and d.kind == kind]
                print(f"rollart hook: {hook_name} -> plugin {record.name} registered "
                      f"{after - before} {kind}(s): {', '.join(names) or '-'}", file=sys.stderr)


def _fill_records(registry: Registry, records: dict[str, PluginRecord]) -> None:
    """What each plugin registered, and the conflicts it takes part in (on both rows)."""
    for desc in registry.all():
        rec = records[desc.plugin]
        rec.registered.setdefault(desc.kind, []).append(desc.name)
        rec.summaries[f"{desc.kind}:{desc.name}"] = desc.summary
        if desc.traits.get("simulated"):
            rec.simulated.append(f"{desc.kind}:{desc.name}")
    for (kind, name), claims in registry.conflicts.items():
        message = registry.conflict_message(kind, name) or ""
        for desc in claims:
            rec = records[desc.plugin]
            if name not in rec.registered.get(kind, []):
                rec.registered.setdefault(kind, []).append(name)
                rec.summaries[f"{kind}:{name}"] = desc.summary
            rec.conflicts.append(message)


def load_plugins(
    autoload: bool = True,
    extra: dict[str, ModuleType | object] | None = None,
    strict: bool | None = None,
) -> PluginSet:
    """Discover, import and register plugins; build the registry.

    ``autoload=False`` skips entry points (tests use it for isolation); ``extra`` adds
    plugin objects by name (e.g. a module defined in a test).
    """
    strict = _strict() if strict is None else strict
    disabled = _env_list("ROLLART_DISABLE_PLUGINS")
    pm = new_plugin_manager()
    records: dict[str, PluginRecord] = {}
    for name, dist, ver, modname, source in _candidates(autoload, extra):
        if name in records:  # same entry point twice (e.g. two installs): keep the first
            continue
        record = records[name] = PluginRecord(
            name=name, distribution=dist, version=ver, module=modname,
            builtin=name in DEFAULT_PLUGINS,
        )
        if name in disabled:
            record.disabled = True
            pm.set_blocked(name)
            continue
        _import_and_register(pm, record, source, strict)
    registry = Registry()
    _call_registration_hooks(pm, records, registry, strict)
    for rec in records.values():
        if rec.disabled or rec.error:
            reason = rec.status if rec.disabled else rec.error or ""
            registry.not_loaded[rec.name] = reason
            if rec.distribution:
                registry.not_loaded[rec.distribution] = reason
    _fill_records(registry, records)
    for (kind, name), (plugin, reason) in registry.unavailable.items():
        records[plugin].unavailable[f"{kind}:{name}"] = reason
    if strict and registry.conflicts:
        (kind, name), *_ = registry.conflicts
        raise PluginError(registry.conflict_message(kind, name) or "")
    return PluginSet(pm=pm, registry=registry, records=records,
                     warnings=_disable_warnings(disabled, records))


def _dist_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


_DEFAULT: PluginSet | None = None


def get_plugins(reload: bool = False) -> PluginSet:
    """The process-wide plugin set (loaded once)."""
    global _DEFAULT
    if _DEFAULT is None or reload:
        _DEFAULT = load_plugins()
    return _DEFAULT


def get_registry() -> Registry:
    return get_plugins().registry
