"""Name -> descriptor -> lazily imported implementation, one namespace per plugin kind."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from rollart_sdk.errors import ConfigError, PluginError, UnknownBackendError
from rollart_sdk.interfaces import KINDS

# Names that first-party plugin packages provide, so an unknown name can say what to install.
FIRST_PARTY: dict[tuple[str, str], str] = {
    ("env", "frozenlake"): "rollart-env-frozenlake (plugins/envs/rollart-env-frozenlake)",
    ("env", "arithmetic"): "rollart-env-arithmetic (plugins/envs/rollart-env-arithmetic)",
    ("env", "sokoban"): "rollart-env-sokoban (plugins/envs/rollart-env-sokoban)",
    ("env", "sandbox"): "rollart-env-sandbox (plugins/envs/rollart-env-sandbox)",
    ("reward", "rule"): "rollart-reward-rule (plugins/rewards/rollart-reward-rule)",
    ("reward", "serverless"): "rollart-reward-serverless (plugins/rewards/rollart-reward-serverless)",
    ("engine", "torch"): "rollart-engine-torch (plugins/engines/rollart-engine-torch)",
    ("engine", "vllm"): "rollart-engine-vllm (plugins/engines/rollart-engine-vllm)",
    ("engine", "sglang"): "rollart-engine-sglang (plugins/engines/rollart-engine-sglang)",
    ("trainer", "torch"): "rollart-trainer-torch (plugins/trainers/rollart-trainer-torch)",
    ("trainer", "megatron"): "rollart-trainer-megatron (plugins/trainers/rollart-trainer-megatron)",
    ("transport", "ray"): "rollart-transport-ray (plugins/transports/rollart-transport-ray)",
    ("transport", "nccl"): "rollart-transport-nccl (plugins/transports/rollart-transport-nccl)",
    ("transport", "mooncake"): "rollart-transport-mooncake (plugins/transports/rollart-transport-mooncake)",
}

# Name prefixes a first-party plugin provides (e.g. every "gem/<id>").
FIRST_PARTY_PREFIXES: dict[tuple[str, str], str] = {
    ("env", "gem/"): "rollart-env-gem (plugins/envs/rollart-env-gem)",
}


class NoOptions(BaseModel):
    """Options model of a backend that takes none: any key is an error."""

    model_config = ConfigDict(extra="forbid")


def import_string(spec: str) -> Any:
    """Import ``"package.module:attr"`` (``attr`` may be dotted)."""
    if ":" not in spec:
        raise PluginError(f"bad import string {spec!r}: expected 'module:attr'")
    module_name, attr = spec.split(":", 1)
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Descriptor:
    """What a plugin registered under one name; cheap until ``load`` is called."""

    kind: str
    name: str
    factory: str | Callable[..., Any]
    options: str | type[BaseModel] | None
    summary: str
    plugin: str
    distribution: str | None = None
    version: str | None = None
    # Facts a plugin states about the backend (envs: "turns", "character"), for `rollart envs`.
    traits: dict[str, Any] = field(default_factory=dict)

    def options_model(self) -> type[BaseModel]:
        if self.options is None:
            return NoOptions
        if isinstance(self.options, str):
            model = import_string(self.options)
        else:
            model = self.options
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise PluginError(
                f"{self.kind} {self.name!r} from plugin {self.plugin!r}: options must be a "
                f"pydantic BaseModel subclass, got {model!r}"
            )
        return model

    def validate_options(
        self, options: dict[str, Any] | None, where: str = "options", lines: Any = None
    ) -> BaseModel:
        """Validate ``options`` with the backend's own model; errors name ``where.<key>``.

        ``lines`` (a ``config.LineMap``) adds the YAML line of each bad key.
        """
        model = self.options_model()
        try:
            return model.model_validate(options or {})
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                path = ".".join([where, *(str(p) for p in err["loc"])])
                problems.append((_with_line(path, lines), _explain(err, model)))
            raise ConfigError(problems) from None

    def load(self) -> Callable[..., Any]:
        if callable(self.factory):
            return self.factory
        try:
            return import_string(self.factory)
        except Exception as exc:  # noqa: BLE001 - re-raised with context
            raise PluginError(
                f"{self.kind} {self.name!r} (plugin {self.plugin!r}) failed to import "
                f"{self.factory!r}: {type(exc).__name__}: {exc}"
            ) from exc

    def create(self, options: dict[str, Any] | BaseModel | None = None, **context: Any) -> Any:
        """Validate ``options`` and call the factory with them plus ``context`` kwargs."""
        if not isinstance(options, BaseModel):
            options = self.validate_options(options)
        return self.load()(**context, **options.model_dump())


def _with_line(path: str, lines: Any) -> str:
    if lines is None:
        return path
    line = lines.line_of(path)
    return f"{path} (line {line})" if line else path


def _explain(err: dict[str, Any], model: type[BaseModel]) -> str:
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        allowed = ", ".join(model.model_fields) or "none"
        msg = f"unknown key; allowed keys: {allowed}"
    elif "input" in err and err["type"] != "missing":
        msg = f"{msg} (got {err['input']!r})"
    return msg


@dataclass
class Registrar:
    """The object a ``rollart_register_*`` hook receives: registers names of one kind."""

    kind: str
    registry: Registry
    plugin: str
    distribution: str | None = None
    version: str | None = None

    def register(
        self,
        name: str,
        factory: str | Callable[..., Any],
        options: str | type[BaseModel] | None = None,
        summary: str = "",
        traits: dict[str, Any] | None = None,
    ) -> Descriptor:
        desc = Descriptor(
            kind=self.kind,
            name=name,
            factory=factory,
            options=options,
            summary=summary,
            plugin=self.plugin,
            distribution=self.distribution,
            version=self.version,
            traits=dict(traits or {}),
        )
        self.registry.add(desc)
        return desc

    def unavailable(self, name: str, reason: str) -> None:
        """Say that this plugin knows ``name`` but does not register it here, and why
        (e.g. it would download data); `rollart plugins` and a config naming it show why."""
        self.registry.unavailable[(self.kind, name)] = (self.plugin, reason)


@dataclass
class Registry:
    """All registered backends, by kind and name."""

    _by_kind: dict[str, dict[str, Descriptor]] = field(
        default_factory=lambda: {k: {} for k in KINDS}
    )
    # (kind, name) -> (plugin, reason): names a plugin declined to register.
    unavailable: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)

    def add(self, desc: Descriptor) -> None:
        if desc.kind not in self._by_kind:
            raise PluginError(f"unknown plugin kind {desc.kind!r}; kinds: {', '.join(KINDS)}")
        if not desc.name or not isinstance(desc.name, str):
            raise PluginError(f"plugin {desc.plugin!r} registered a {desc.kind} with no name")
        existing = self._by_kind[desc.kind].get(desc.name)
        if existing is not None:
            raise PluginError(
                f"{desc.kind} {desc.name!r} is registered twice: by "
                f"{existing.distribution or existing.plugin} and by "
                f"{desc.distribution or desc.plugin}. Uninstall one of them, or block one "
                f"with ROLLART_DISABLE_PLUGINS={desc.plugin}."
            )
        self._by_kind[desc.kind][desc.name] = desc
        self.unavailable.pop((desc.kind, desc.name), None)
        if desc.kind == "env" and isinstance(desc.factory, str):
            _register_with_gymnasium(desc)

    def names(self, kind: str) -> list[str]:
        return sorted(self._by_kind.get(kind, {}))

    def all(self) -> list[Descriptor]:
        return [d for kind in KINDS for d in self._by_kind[kind].values()]

    def get(self, kind: str, name: str) -> Descriptor:
        if kind not in self._by_kind:
            raise PluginError(f"unknown plugin kind {kind!r}; kinds: {', '.join(KINDS)}")
        try:
            return self._by_kind[kind][name]
        except KeyError:
            hint = ""
            if (kind, name) in self.unavailable:
                plugin, reason = self.unavailable[(kind, name)]
                hint = f"Plugin {plugin!r} knows it but did not register it: {reason}"
            elif (kind, name) in FIRST_PARTY:
                hint = f"It is provided by {FIRST_PARTY[(kind, name)]}: pip install it."
            elif provider := next((v for (k, prefix), v in FIRST_PARTY_PREFIXES.items()
                                   if k == kind and name.startswith(prefix)), None):
                hint = f"It would be provided by {provider}: pip install it."
            else:
                hint = "Install the plugin that provides it (see `rollart plugins`)."
            raise UnknownBackendError(kind, name, self.names(kind), hint) from None


def _register_with_gymnasium(desc: Descriptor) -> None:
    """Make ``gymnasium.make("rollart/<name>")`` find the env (imports only at make)."""
    import gymnasium

    env_id = f"rollart/{desc.name}"
    if env_id not in gymnasium.registry:
        gymnasium.register(id=env_id, entry_point=desc.factory)
