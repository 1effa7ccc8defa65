"""Name -> descriptor -> lazily imported implementation, one namespace per plugin kind."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from rollart_sdk.errors import ConfigError, PluginError, UnknownBackendError
from rollart_sdk.interfaces import KINDS

# `rollart bench NAME` of the first-party benchmark package (plugins/benchmarks/
# rollart-benchmark-suite; `rollart bench` names it when it is not installed).
BENCHMARK_SUITE = ("async", "calibration", "dispatch", "driver", "gateway", "paper", "small",
                   "soak", "straggler", "turns", "weights")

# Names that first-party plugin packages in this repository provide, so an unknown name can
# say what to install. Only packages that exist under plugins/ (tests/test_registry.py checks).
FIRST_PARTY: dict[tuple[str, str], str] = {
    ("env", "frozenlake"): "rollart-env-frozenlake",
    ("env", "arithmetic"): "rollart-env-arithmetic",
    ("env", "category"): "rollart-env-category",
    ("reward", "rule"): "rollart-reward-rule",
    ("reward", "serverless"): "rollart-reward-serverless",
    ("reward", "judge"): "rollart-reward-judge",
    ("engine", "torch"): "rollart-engine-torch",
    ("engine", "vllm"): "rollart-engine-vllm",
    ("engine", "sglang"): "rollart-engine-sglang",
    ("trainer", "torch"): "rollart-trainer-torch",
    ("trainer", "megatron"): "rollart-trainer-megatron",
    ("transport", "ray"): "rollart-transport-ray",
    ("transport", "nccl"): "rollart-transport-nccl",
    ("env", "sokoban"): "rollart-env-sokoban",
    ("env", "sandbox"): "rollart-env-sandbox",
    ("env", "calc_agent"): "rollart-env-calc-agent",
    ("transport", "mooncake"): "rollart-transport-mooncake",
    ("sink", "tensorboard"): "rollart-sink-tensorboard",
    ("sink", "mlflow"): "rollart-sink-mlflow",
    ("sink", "wandb"): "rollart-sink-wandb",
    **{("benchmark", name): "rollart-benchmark-suite" for name in BENCHMARK_SUITE},
}

# Name prefixes a first-party plugin provides (e.g. every "gem/<id>").
FIRST_PARTY_PREFIXES: dict[tuple[str, str], str] = {
    ("env", "gem/"): "rollart-env-gem",
}


class NoOptions(BaseModel):
    """Options model of a backend that takes none: any key is an error."""

    model_config = ConfigDict(extra="forbid")


def find_string(spec: str) -> str | None:
    """Check that ``"package.module:attr"`` names something, importing as little as possible.

    The module is located with ``importlib.util.find_spec`` (parent packages are imported,
    the module itself is not) and ``attr``'s first part is looked up among the module's
    top-level definitions in its source, so a typo is found without importing torch or any
    other heavy dependency the module has. Returns None when found, else what is wrong.
    """
    import ast
    import importlib.util

    if ":" not in spec:
        return f"bad import string {spec!r}: expected 'module:attr'"
    module_name, attr = spec.split(":", 1)
    try:
        found = importlib.util.find_spec(module_name)
    except Exception as exc:  # noqa: BLE001 - a parent package failed to import
        return f"module {module_name!r} cannot be located ({type(exc).__name__}: {exc})"
    if found is None:
        return f"module {module_name!r} not found"
    origin = found.origin
    if not origin or not origin.endswith(".py"):
        try:  # no source to read (extension module, namespace package): import it
            import_string(spec)
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            return f"{spec!r} cannot be imported ({type(exc).__name__}: {exc})"
        return None
    with open(origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), origin)
    if attr.split(".")[0] not in _top_level_names(tree):
        return f"module {module_name!r} ({origin}) defines no {attr.split('.')[0]!r}"
    return None


def _top_level_names(tree: Any) -> set[str]:
    import ast

    names: set[str] = set()
    nodes = list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:`, `try: import ...`
            nodes += node.body + node.orelse + getattr(node, "finalbody", [])
            nodes += [n for h in getattr(node, "handlers", []) for n in h.body]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def importable(module: str) -> bool:
    """Whether ``module`` can be imported here (``find_spec``: nothing imported but a
    dotted name's parents)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


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
    # Works only when every party shares one process (e.g. the ``local`` transport):
    # ``rollart validate`` refuses it for a run whose workers are Ray processes.
    process_local: bool = False
    # What one instance needs from the resource plane, e.g. {"GPU": 1} for a reward model.
    # Empty: it runs inside the process that uses it (a rule reward runs in the control
    # plane's process, with no reserved worker).
    resources: dict[str, float] = field(default_factory=dict, hash=False)
    # Python modules the backend imports when it starts (a heavy stack the plugin does not
    # pull in, e.g. vLLM), each with how to install it: checked before a run starts.
    requires: dict[str, str] = field(default_factory=dict, hash=False)

    def missing(self, options: Any = None) -> list[str]:
        """One line per module of ``requires`` that is not importable here, with its
        install hint (located with ``importlib.util.find_spec``, nothing imported but a
        dotted name's parents); with the backend's validated ``options``, also those its
        options need (an options model's ``requires()``: module -> hint, e.g. trainer
        ``torch``'s ``lora`` needs peft)."""
        out = [f"{self.kind} {self.name!r} needs the Python package that provides "
               f"{module!r}, which is not installed in this Python; {how}"
               for module, how in self.requires.items() if not importable(module)]
        wanted = getattr(options, "requires", None)
        if callable(wanted):
            out += [f"{self.kind} {self.name!r} with these options needs the Python package "
                    f"that provides {module!r}, which is not installed in this Python; {how}"
                    for module, how in wanted().items() if not importable(module)]
        return out

    @property
    def origin(self) -> str:
        """Who registered it: the distribution, else the plugin name."""
        return self.distribution or self.plugin

    def check_paths(self) -> list[str]:
        """Every path string this registration names that does not resolve (factory,
        options model), located without importing the backend (:func:`find_string`)."""
        problems = []
        for what, spec in (("factory", self.factory), ("options", self.options)):
            if isinstance(spec, str):
                why = find_string(spec)
                if why:
                    problems.append(
                        f"{self.kind} {self.name!r} from plugin {self.plugin!r}: its {what} "
                        f"path {spec!r} does not resolve: {why}; fix the plugin's registration"
                    )
        return problems

    def options_model(self) -> type[BaseModel]:
        if self.options is None:
            return NoOptions
        if isinstance(self.options, str):
            try:
                model = import_string(self.options)
            except Exception as exc:  # noqa: BLE001 - any import failure: say which path
                raise PluginError(
                    f"{self.kind} {self.name!r} from plugin {self.plugin!r}: its options model "
                    f"{self.options!r} cannot be imported ({type(exc).__name__}: {exc}); fix "
                    f"the path in the plugin's registration"
                ) from None
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
        except Exception as exc:
            raise PluginError(
                f"{self.kind} {self.name!r} (plugin {self.plugin!r}) failed to import "
                f"{self.factory!r}: {type(exc).__name__}: {exc}"
            ) from exc

    def create(self, options: dict[str, Any] | BaseModel | None = None, *,
               offer: Mapping[str, Any] | None = None, **context: Any) -> Any:
        """Validate ``options`` and call the factory with them plus ``context`` kwargs.

        ``offer``: keyword arguments passed only to a factory that names them as
        parameters (as pluggy passes a hook only the arguments it names): what a worker
        knows that few backends need, e.g. its ``binding`` (pool, hardware) or a simulated
        run's ``sim`` context (rollart_sdk/sim/backends.py)."""
        if not isinstance(options, BaseModel):
            options = self.validate_options(options)
        factory = self.load()
        return factory(**context, **accepted(factory, offer or {}), **options.model_dump())


def accepted(factory: Callable[..., Any], offer: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``offer`` that ``factory`` names as keyword parameters (not as
    ``**kwargs``)."""
    if not offer:
        return {}
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: offer nothing
        return {}
    named = {n for n, p in params.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in offer.items() if k in named}


def _with_line(path: str, lines: Any) -> str:
    if lines is None:
        return path
    return str(lines.where(path))


def _explain(err: Mapping[str, Any], model: type[BaseModel]) -> str:
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
        process_local: bool = False,
        resources: dict[str, float] | None = None,
        requires: dict[str, str] | None = None,
    ) -> Descriptor:
        """Register backend ``name`` of this registrar's kind (docs/plugins.md, step 5).

        - ``factory``: ``"module:attr"`` of a callable (imported only when a config selects
          ``name``) or the callable; called with the validated options as keyword
          arguments plus the kind's context arguments (an engine: ``model=``);
        - ``options``: ``"module:Model"`` of a pydantic model (``extra="forbid"``; give each
          field a ``Field(description=...)``: ``rollart plugins --options KIND:NAME`` shows
          it), the model class, or None for a backend without options;
        - ``summary``: one line for ``rollart plugins``;
        - ``traits``: facts about the backend that listings show. Envs: ``"turns"`` (the
          turn budget, e.g. ``"max_replies (default 4)"`` or an int) and ``"character"``
          (e.g. ``"multi-turn, prefill-heavy"``): the turns and character columns of
          ``rollart envs``; any kind: ``"simulated": True`` for a backend that only models
          time for ``rollart sim`` (listed apart from the real ones); ``"benchmark": True``
          for one only a benchmark uses (never offered as a "did you mean");
        - ``process_local``: works only when every party shares one process (the ``local``
          transport); ``rollart validate`` refuses it for a Ray run;
        - ``resources``: what one instance needs from the resource plane, e.g.
          ``{"GPU": 1}`` for a reward model; empty: it runs in the process that uses it;
        - ``requires``: Python modules the backend imports when it starts that the plugin
          package does not pull in, each with how to install it (``{"vllm": "pip install
          vllm"}``): validate warns and train stops before Ray starts when one is missing.
        """
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
            process_local=process_local,
            resources=dict(resources or {}),
            requires=dict(requires or {}),
        )
        self.registry.add(desc)
        return desc

    def unavailable(self, name: str, reason: str) -> None:
        """Say that this plugin knows ``name`` but does not register it here, and why
        (e.g. it would download data); `rollart plugins` and a config naming it show why."""
        self.registry.unavailable[(self.kind, name)] = (self.plugin, reason)


@dataclass
class Registry:
    """All registered backends, by kind and name.

    A name registered twice for one kind is a conflict: the first registration stays in
    place, both are recorded in ``conflicts`` (``rollart plugins`` shows them on both
    plugins' rows), and only a run that selects the name fails (:meth:`get`).
    """

    _by_kind: dict[str, dict[str, Descriptor]] = field(
        default_factory=lambda: {k: {} for k in KINDS}
    )
    conflicts: dict[tuple[str, str], list[Descriptor]] = field(default_factory=dict)
    # (kind, name) -> (plugin, reason): names a plugin declined to register.
    unavailable: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    # Installed plugins that registered nothing, by entry-point name and distribution ->
    # why ("disabled (ROLLART_DISABLE_PLUGINS)", "failed to import: ..."): an unknown name
    # says which of them may be the one that provides it.
    not_loaded: dict[str, str] = field(default_factory=dict)

    def add(self, desc: Descriptor) -> None:
        if desc.kind not in self._by_kind:
            raise PluginError(f"unknown plugin kind {desc.kind!r}; kinds: {', '.join(KINDS)}")
        if not desc.name or not isinstance(desc.name, str):
            raise PluginError(f"plugin {desc.plugin!r} registered a {desc.kind} with no name")
        existing = self._by_kind[desc.kind].get(desc.name)
        if existing is not None:
            self.conflicts.setdefault((desc.kind, desc.name), [existing]).append(desc)
            return
        self._by_kind[desc.kind][desc.name] = desc
        self.unavailable.pop((desc.kind, desc.name), None)
        if desc.kind == "env" and isinstance(desc.factory, str):
            _register_with_gymnasium(desc)

    def conflict_message(self, kind: str, name: str) -> str | None:
        """Why ``kind`` ``name`` cannot be used (two plugins register it), or None."""
        claims = self.conflicts.get((kind, name))
        if not claims:
            return None
        who = " and by ".join(d.origin for d in claims)
        plugins = ",".join(d.plugin for d in claims[1:])
        return (f"{kind} {name!r} is registered twice: by {who}. Uninstall one of them, or "
                f"block one with ROLLART_DISABLE_PLUGINS={plugins}.")

    def names(self, kind: str) -> list[str]:
        return sorted(self._by_kind.get(kind, {}))

    def all(self) -> list[Descriptor]:
        return [d for kind in KINDS for d in self._by_kind[kind].values()]

    def get(self, kind: str, name: str) -> Descriptor:
        """The descriptor of ``kind`` ``name``; UnknownBackendError (with "did you mean"
        and what to install) when none is registered, PluginError on a conflict."""
        if kind not in self._by_kind:
            raise PluginError(f"unknown plugin kind {kind!r}; kinds: {', '.join(KINDS)}")
        conflict = self.conflict_message(kind, name)
        if conflict:
            raise PluginError(conflict)
        try:
            return self._by_kind[kind][name]
        except KeyError:
            if (kind, name) in self.unavailable:
                plugin, reason = self.unavailable[(kind, name)]
                hint = f"Plugin {plugin!r} knows it but did not register it: {reason}"
            else:
                hint = install_hint(kind, name, self.not_loaded)
            # Benchmark-only backends (trait "benchmark") are not offered to a typo.
            offered = [n for n in self.names(kind)
                       if not self._by_kind[kind][n].traits.get("benchmark")]
            raise UnknownBackendError(kind, name, offered, hint) from None


def install_hint(kind: str, name: str, unavailable: dict[str, str] | None = None) -> str:
    """What to do about an unknown name, in exact words: the providing plugin is disabled,
    failed to import (with the error), or is not installed (then what to install)."""
    unavailable = unavailable or {}
    dist = FIRST_PARTY.get((kind, name))
    if dist is not None:
        if dist in unavailable:
            return f"It is provided by {dist}, which is installed but {unavailable[dist]}."
        from rollart_sdk.doctor import HEAVY

        heavy = HEAVY.get(dist)
        how = (f"; from a checkout, with its stack: bash scripts/install.sh --with {heavy.backend}"
               if heavy else "")
        return (f"It is provided by {dist}, which is not installed: pip install {dist} "
                f"(plugins/{kind}s/{dist} in the rollart-sdk repository{how}).")
    prefixed = next((v for (k, prefix), v in FIRST_PARTY_PREFIXES.items()
                     if k == kind and name.startswith(prefix)), None)
    if prefixed is not None:
        if prefixed in unavailable:
            return f"It would be provided by {prefixed}, which is installed but {unavailable[prefixed]}."
        return f"It would be provided by {prefixed}, which is not installed: pip install {prefixed}."
    candidates = {p: why for p, why in unavailable.items() if name in p}
    if candidates:
        return " ".join(f"Plugin {p!r} may provide it; it is installed but {why}." for p, why in
                        sorted(candidates.items()))
    if unavailable:
        listed = "; ".join(f"{p}: {why}" for p, why in sorted(unavailable.items()))
        return f"Not installed, or in a plugin that did not load ({listed})."
    return "No installed plugin provides it: install one (see `rollart plugins`)."


def _register_with_gymnasium(desc: Descriptor) -> None:
    """Make ``gymnasium.make("rollart/<name>")`` find the env (imports only at make)."""
    import gymnasium

    env_id = f"rollart/{desc.name}"
    if env_id not in gymnasium.registry:
        gymnasium.register(id=env_id, entry_point=desc.factory)
