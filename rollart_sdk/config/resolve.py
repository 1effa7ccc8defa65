"""Resolve every backend a config names and validate each options block with its plugin."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from rollart_sdk.config.files import LineMap
from rollart_sdk.config.schema import Backend, RunConfig
from rollart_sdk.errors import ConfigError, PluginError, UnknownBackendError
from rollart_sdk.registry import Descriptor, Registry


@dataclass
class Resolved:
    """A backend choice after resolution: its descriptor and validated options."""

    descriptor: Descriptor
    options: BaseModel

    def create(self, **context: Any) -> Any:
        return self.descriptor.create(self.options, **context)


@dataclass
class ResolvedRun:
    config: RunConfig
    engine: Resolved
    trainer: Resolved
    transport: Resolved
    placement: Resolved
    envs: dict[str, Resolved] = field(default_factory=dict)  # tag -> env
    rewards: dict[str, Resolved] = field(default_factory=dict)  # tag -> reward
    sinks: list[Resolved] = field(default_factory=list)  # logging[i]
    # (config key, problem) per selected backend whose heavy stack is not importable here
    # (Descriptor.requires): `validate` warns (the config itself is right), `train` stops
    # before any worker starts.
    missing: list[tuple[str, str]] = field(default_factory=list)


def resolve_run(cfg: RunConfig, registry: Registry, lines: LineMap | None = None,
                in_process: bool = False) -> ResolvedRun:
    """Resolve all names; raise one ConfigError listing every problem found.

    Each selected backend's registered paths (factory, options model) must resolve, and a
    ``process_local`` backend (e.g. the ``local`` transport) is refused unless the run is
    ``in_process`` (every worker in this process; a Ray run puts them in separate ones).
    """
    problems: list[tuple[str, str]] = []
    missing: list[tuple[str, str]] = []
    lines = lines or LineMap()

    def one(kind: str, backend: Backend, where: str) -> Resolved | None:
        at = lines.where(f"{where}.name")
        try:
            desc = registry.get(kind, backend.name)
        except (UnknownBackendError, PluginError) as exc:
            problems.append((at, str(exc)))
            return None
        problems.extend((at, why) for why in desc.check_paths())
        if desc.process_local and not in_process:
            problems.append((at, f"{kind} {desc.name!r} works only inside one process, but "
                             "this run starts its workers as separate Ray processes; choose "
                             f"a cross-process {kind} (installed: "
                             f"{', '.join(_cross_process(registry, kind))}), or run "
                             "every worker in one process (layout: inprocess)"))
        options = None
        try:
            options = desc.validate_options(backend.options, f"{where}.options", lines)
        except ConfigError as exc:
            problems.extend(exc.problems)
        except PluginError as exc:
            problems.append((f"{where}.options", str(exc)))
        # Its heavy stack, and what its options need (trainer torch's lora: peft).
        missing.extend((at, why) for why in desc.missing(options))
        return None if options is None else Resolved(desc, options)

    engine = one("engine", cfg.engine, "engine")
    trainer = one("trainer", cfg.trainer, "trainer")
    transport = one("transport", cfg.transport, "transport")
    placement = one("placement", cfg.placement, "placement")
    envs: dict[str, Resolved] = {}
    rewards: dict[str, Resolved] = {}
    for i, task in enumerate(cfg.tasks):
        env = one("env", task.env, f"tasks.{i}.env")
        rew = one("reward", task.reward, f"tasks.{i}.reward")
        if env:
            envs[task.tag] = env
        if rew:
            rewards[task.tag] = rew
    sinks = [one("sink", b, f"logging.{i}") for i, b in enumerate(cfg.logging)]
    if problems:
        raise ConfigError(problems)
    assert engine and trainer and transport and placement
    return ResolvedRun(cfg, engine, trainer, transport, placement, envs, rewards,
                       [s for s in sinks if s is not None], missing)


def _cross_process(registry: Registry, kind: str) -> list[str]:
    names = sorted(d.name for d in registry.all() if d.kind == kind and not d.process_local)
    return names or ["none: install one, e.g. rollart-transport-ray"]
