"""Plugin manager: entry-point loading with broken plugins isolated, then registration.

Loading rules (what users rely on):

- every distribution exposing an entry point in group ``rollart`` is imported; one whose
  import raises is recorded with its error and skipped (``ROLLART_STRICT_PLUGINS=1``
  turns that into an error);
- ``ROLLART_DISABLE_PLUGINS=a,b`` blocks plugins by entry-point name before import;
- a hook implementation whose name matches no hook (a typo) is caught by pluggy's
  ``check_pending`` and that plugin is skipped with the error recorded;
- the built-in defaults register through the same hooks as third-party plugins;
- two plugins registering the same name for the same kind is an error naming both.
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
    "rollart-builtins": "rollart_sdk.builtins.placements",
    "rollart-builtins-transports": "rollart_sdk.builtins.transports",
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
    hooks: list[str] = field(default_factory=list)
    error: str | None = None
    disabled: bool = False

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
            "error": self.error,
            "disabled": self.disabled,
        }


@dataclass
class PluginSet:
    """The loaded plugins: the pluggy manager, the registry and one record per plugin."""

    pm: pluggy.PluginManager
    registry: Registry
    records: dict[str, PluginRecord]

    @property
    def errors(self) -> dict[str, str]:
        return {n: r.error for n, r in self.records.items() if r.error}


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if os.environ.get("ROLLART_TRACE_HOOKS"):
        pm.trace.root.setwriter(print)
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
        record.error = f"{type(exc).__name__}: {exc}"
        return False
    record.hooks = sorted(h.name for h in pm.get_hookcallers(module) or [])
    return True


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

    candidates: list[tuple[str, str | None, str | None, str, Any]] = []
    for name, mod in DEFAULT_PLUGINS.items():
        candidates.append((name, "rollart-sdk", _dist_version("rollart-sdk"), mod, None))
    if autoload:
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist else None
            ver = ep.dist.version if ep.dist else None
            candidates.append((ep.name, dist, ver, ep.value, ep))
    for name, obj in (extra or {}).items():
        candidates.append((name, None, None, getattr(obj, "__name__", repr(obj)), obj))

    for name, dist, ver, modname, source in candidates:
        if name in records:  # same entry point twice (e.g. two installs): keep the first
            continue
        record = PluginRecord(
            name=name,
            distribution=dist,
            version=ver,
            module=modname,
            builtin=name in DEFAULT_PLUGINS,
        )
        records[name] = record
        if name in disabled:
            record.disabled = True
            pm.set_blocked(name)
            continue
        try:
            if source is None:
                module = importlib.import_module(modname)
            elif hasattr(source, "load") and hasattr(source, "group"):
                module = source.load()
            else:
                module = source
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the rest
            record.error = f"{type(exc).__name__}: {exc}"
            if strict:
                raise PluginError(f"plugin {name!r} failed to import: {record.error}") from exc
            continue
        if not _register_module(pm, module, record) and strict:
            raise PluginError(f"plugin {name!r} is invalid: {record.error}")

    registry = Registry()
    # Each plugin's hook is called on its own so its registrations carry its name;
    # ROLLART_TRACE_HOOKS=1 prints these calls (pluggy's tracing sees only pm.hook calls).
    tracing = bool(os.environ.get("ROLLART_TRACE_HOOKS"))
    for kind, hook_name in hookspecs.KIND_HOOKS.items():
        caller = getattr(pm.hook, hook_name)
        for impl in caller.get_hookimpls():
            record = records[impl.plugin_name]
            registrar = Registrar(kind, registry, record.name, record.distribution, record.version)
            kwargs = {"registry": registrar}
            if tracing:
                print(f"rollart hook: {hook_name}(registry) -> plugin {record.name}", file=sys.stderr)
            try:
                impl.function(*[kwargs[a] for a in impl.argnames])
            except PluginError:
                raise  # conflicts between plugins are the user's to resolve: never hidden
            except Exception as exc:  # noqa: BLE001
                record.error = f"{hook_name} raised {type(exc).__name__}: {exc}"
                if strict:
                    raise PluginError(f"plugin {record.name!r}: {record.error}") from exc
    for desc in registry.all():
        rec = records[desc.plugin]
        rec.registered.setdefault(desc.kind, []).append(desc.name)
        rec.summaries[f"{desc.kind}:{desc.name}"] = desc.summary
    for (kind, name), (plugin, reason) in registry.unavailable.items():
        records[plugin].unavailable[f"{kind}:{name}"] = reason
    return PluginSet(pm=pm, registry=registry, records=records)


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
